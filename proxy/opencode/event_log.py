"""Reading a v2 session's durable event log: is a tool call still open there?

The message row says a tool is running; before an event that fails it is appended, the
log must agree, or the append would duplicate what the server already recorded. (Measured
on 1.18.33: `/sync/replay` accepts a second `tool.failed` for the same call.) The events'
names are in :mod:`proxy.opencode.vocabulary`.

1.18.33's `/sync/history` has no filter by session: a session listed in the body gets its events
after the seq given, and every other aggregate its whole history (`server/instance/sync.ts`,
`SyncRoutes` "/history"), so the answer grows with the whole database, some 9 KB a soak session.
Its rows are decoded into `LogRow`s, which keep only what the log is read for: the rest of each
row, its `data` above all, is skipped without building a Python object for it.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from proxy.opencode.vocabulary import CALL_OPENING, event_name


class _RowData(msgspec.Struct):
    call: str | None = msgspec.field(default=None, name="callID")


class LogRow(msgspec.Struct):
    """One event of `/sync/history`: its session, seq, type and the call it is about, if any."""

    aggregate_id: str
    seq: int
    type: str
    data: _RowData = msgspec.field(default_factory=_RowData)

    @property
    def call(self) -> str | None:
        return self.data.call


_ROWS = msgspec.json.Decoder(list[LogRow])


def log_rows(body: bytes) -> list[LogRow]:
    """The rows of a `/sync/history` answer (an answer of another shape raises `msgspec.DecodeError`,
    which fails the write-back pass like any other unexpected answer)."""
    return _ROWS.decode(body)


def call_left_open(call_events: Iterable[tuple[int, str]], prompt_seqs: Iterable[int]) -> bool:
    """Whether the call's last event (seq, type) opened it and no prompt was admitted after it.

    A prompt admitted after the call means the server will settle the call itself on that
    turn; writing it too would record the failure twice.
    """
    last = max(call_events, default=None)
    if last is None or event_name(last[1]) not in CALL_OPENING:
        return False
    return all(seq < last[0] for seq in prompt_seqs)
