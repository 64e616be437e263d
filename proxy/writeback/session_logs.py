"""Where a v2 session's event log is read before a `tool.failed` is appended to it.

1.18.33's `/sync/history` has no filter by session: it answers every session's whole history
(`event_log`), and its event table holds every v1 part update with the part, tool output and
all. On a user's database that is the whole database, built by the server in its memory and sent
for one append. The database on this host, when it holds the session, answers the same rows
read-only from its index (`event_aggregate_seq_idx`, `aggregate_id` then `seq`), in a thread. A
session id is the server's own random id, so a database that holds events of it is the server's;
one that holds none (another server's, an absent or unreadable file) leaves the read to the API.
The append that follows is checked by the server either way (`/sync/replay` refuses a seq
already taken), so a read from a copy behind the server costs a retry, never a gap.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from pathlib import Path

from proxy.opencode.client import Credentials, UpstreamApi
from proxy.opencode.event_log import log_rows
from proxy.opencode.vocabulary import event_name
from proxy.system.heap import give_back_free_pages

log = logging.getLogger(__name__)

LogEvent = tuple[int, str, str | None]
"""(seq, event name, callID) of one event of the session's log."""

_STORED = "SELECT seq, type, json_extract(data, '$.callID') FROM event WHERE aggregate_id = ? ORDER BY seq"
_BUSY_TIMEOUT_S = 1.0


class SessionLogs:
    """A v2 session's events, from opencode's `database` on this host when it holds the session,
    else from the server's `/sync/history`; says once in the log why a database there was not read."""

    def __init__(self, upstream: UpstreamApi, database: Path | None = None) -> None:
        self._upstream = upstream
        self._database = database
        self._said = False

    async def read(self, session_id: str, credentials: Credentials) -> list[LogEvent]:
        """Every event of the session's log, in seq order."""
        if self._database is not None:
            stored = await asyncio.to_thread(self._stored, self._database, session_id)
            if stored:
                return stored
        return await self._history(session_id, credentials)

    def _stored(self, path: Path, session_id: str) -> list[LogEvent] | None:
        """The session's rows in the database (None: it cannot be read; empty: not the server's).
        No file there is a server elsewhere, as usual for one on another host: said at DEBUG."""
        if not path.is_file():
            log.debug("no opencode database at %s: v2 session logs are read through /sync/history", path)
            return None
        try:
            uri = f"{path.resolve().as_uri()}?mode=ro"
            with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=_BUSY_TIMEOUT_S)) as db:
                rows = db.execute(_STORED, (session_id,)).fetchall()
        except (sqlite3.Error, OSError, ValueError) as error:
            if not self._said:
                self._said = True
                log.info("v2 session logs are read through /sync/history, not from %s: %s", path, error)
            return None
        return [(int(seq), event_name(str(kind)), _text(call)) for seq, kind, call in rows]

    async def _history(self, session_id: str, credentials: Credentials) -> list[LogEvent]:
        """The session's events through `/sync/history`, the same view of it `/sync/replay` checks.

        Measured on 1.18.33: the body maps the aggregates the caller knows to the last seq it
        has, which must be 0 or more (-1 is refused with 400); a listed aggregate gets its
        events after that seq, every other aggregate its whole history (dropped here). Seq 0
        is the `session.created` every session starts with, so asking after it loses nothing
        and an empty answer means the log ends at 0. The cheaper `/api/session/{id}/history`
        cannot replace it: it shows only `session.next.*` events, while every event type takes
        a seq (renaming a session appends `session.updated.1`). The answer is decoded only as
        far as `LogRow` reads, and the pages it took go back at once: it grows with the
        database, so the heap of a long life would otherwise keep room for the largest one read.
        """
        rows = await self._upstream.call(
            "POST", "/sync/history", credentials, json={session_id: 0}, parse=log_rows
        )
        events = [(row.seq, event_name(row.type), row.call) for row in rows if row.aggregate_id == session_id]
        del rows
        give_back_free_pages()
        return events


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None
