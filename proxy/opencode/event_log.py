"""Reading a v2 session's durable event log: is a tool call still open there?

The message row says a tool is running; before an event that fails it is appended, the
log must agree, or the append would duplicate what the server already recorded. (Measured
on 1.18.33: `/sync/replay` accepts a second `tool.failed` for the same call.)
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from rules import V2_ERROR

_VERSION = re.compile(r"\.\d+$")
_OPENING = ("session.next.tool.input.started", "session.next.tool.input.ended", "session.next.tool.called")
PROMPT_ADMITTED = "session.next.prompt.admitted"
CALL_STARTED = "session.next.tool.called"
CALL_ENDED = frozenset({"session.next.tool.success", "session.next.tool.failed", "session.next.tool.error"})
"""How a v2 call ends; `session.next.tool.progress` and the rest come while it still runs."""


def event_name(kind: str) -> str:
    """`session.next.tool.called.1` (storage) and `session.next.tool.called` (history) alike."""
    return _VERSION.sub("", kind)


def call_left_open(call_events: Iterable[tuple[int, str]], prompt_seqs: Iterable[int]) -> bool:
    """Whether the call's last event (seq, type) opened it and no prompt was admitted after it.

    A prompt admitted after the call means the server will settle the call itself on that
    turn; writing it too would record the failure twice.
    """
    last = max(call_events, default=None)
    if last is None or event_name(last[1]) not in _OPENING:
        return False
    return all(seq < last[0] for seq in prompt_seqs)


def tool_failed_data(session_id: str, message_id: str, item: Mapping[str, Any]) -> dict[str, Any]:
    """The payload of `session.next.tool.failed.1` for a settled tool item, as the server writes it."""
    return {
        "timestamp": item["time"]["completed"],
        "sessionID": session_id,
        "assistantMessageID": message_id,
        "callID": item["id"],
        "error": V2_ERROR,
        "provider": item.get("provider", {"executed": False}),
    }
