"""Reading a v2 session's durable event log: is a tool call still open there?

The message row says a tool is running; before an event that fails it is appended, the
log must agree, or the append would duplicate what the server already recorded. (Measured
on 1.18.33: `/sync/replay` accepts a second `tool.failed` for the same call.) The events'
names are in :mod:`proxy.opencode.vocabulary`.
"""

from __future__ import annotations

from collections.abc import Iterable

from proxy.opencode.vocabulary import CALL_OPENING, event_name


def call_left_open(call_events: Iterable[tuple[int, str]], prompt_seqs: Iterable[int]) -> bool:
    """Whether the call's last event (seq, type) opened it and no prompt was admitted after it.

    A prompt admitted after the call means the server will settle the call itself on that
    turn; writing it too would record the failure twice.
    """
    last = max(call_events, default=None)
    if last is None or event_name(last[1]) not in CALL_OPENING:
        return False
    return all(seq < last[0] for seq in prompt_seqs)
