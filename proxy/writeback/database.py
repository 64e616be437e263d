"""opencode's SQLite store, settled in place: for `--write-back db` and the offline `settle`.

The session's rows are re-read, then the liveness reading is taken, then one short
`BEGIN IMMEDIATE` transaction per session, under a busy timeout, checks that nothing in the
session changed since the re-read and changes only the parts named by the caller that are
still unsettled: the server's own writes are never raced, a turn that started before the
reading is seen in it, one that started after it is seen in the check, and running the same
pass twice changes nothing.

The rows are turned into the API's message shape, the same rules as in the proxy decide,
and the result is turned back with the events the server would have appended: each runtime's
rows are read and written by its class in :mod:`proxy.writeback.db_rows`.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import AsyncIterator, Collection, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiosqlite

from proxy.opencode import jsonio
from proxy.opencode.ids import ascending_id
from proxy.opencode.vocabulary import OPEN_STATUSES
from proxy.writeback.db_rows import RuntimeRows, V1Rows, V2Rows
from proxy.writeback.scheduler import Confirm, Written
from rules import Api, JSONObject, OpenTool

log = logging.getLogger(__name__)

BUSY_TIMEOUT_MS = 5000
TABLES = ("session", "message", "part", "session_message", "event", "event_sequence")
"""The tables of opencode's the proxy reads and writes (`db_rows` and the events appended)."""
KNOWN_TABLES = frozenset({*TABLES, "session_v2"})
"""Any one of them makes a file opencode's (2.x's has `session_v2`, and no `session`)."""


class NotOpencodeDatabase(ValueError):
    """The path is no SQLite file with opencode's tables; nothing was written to it."""


class OpencodeDatabase:
    """An open connection to `opencode.db`; use `OpencodeDatabase.open(path)`."""

    def __init__(self, connection: aiosqlite.Connection) -> None:
        self._db = connection
        self._runtimes: dict[Api, RuntimeRows] = {
            rows.runtime.api: rows for rows in (V1Rows(self), V2Rows(self))
        }

    @classmethod
    @asynccontextmanager
    async def open(cls, path: Path, *, needs: Collection[str] = ()) -> AsyncIterator[OpencodeDatabase]:
        """Connect in autocommit mode, so every transaction is an explicit `BEGIN IMMEDIATE`; a file
        with none of opencode's tables, or without the tables a caller `needs`, is refused first."""
        if await asyncio.to_thread(path.is_dir):
            raise NotOpencodeDatabase(f"not an opencode database: {path}: it is a directory")
        if not await asyncio.to_thread(path.is_file):
            raise FileNotFoundError(f"no opencode database at {path}")
        try:
            connection = await aiosqlite.connect(path, isolation_level=None)
        except sqlite3.Error as error:
            why = f"it cannot be opened ({error})"
            raise NotOpencodeDatabase(f"not an opencode database: {path}: {why}") from None
        try:
            await _require_tables(connection, path, needs)
            await connection.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            yield cls(connection)
        finally:
            await connection.close()

    async def open_tools(self) -> list[OpenTool]:
        """Every tool call recorded as open, of both runtimes, oldest first."""
        found = [
            OpenTool(api, session, message, part, tool, since, directory)
            for api, rows in self._runtimes.items()
            for session, directory, message, part, tool, since in await self.rows(
                rows.open_tools_sql, *sorted(OPEN_STATUSES[rows.runtime.api])
            )
        ]
        return sorted(found, key=lambda tool: tool.since or 0)

    async def settle_session(
        self, api: Api, session_id: str, targets: Collection[str], confirm: Confirm
    ) -> list[Written]:
        """Settle the named parts or calls (or messages) that are still open when re-read, by a
        reading `confirm()` takes after that re-read, in one transaction that first checks that
        nothing in the session changed since the re-read.

        The reading is not taken inside the write transaction: the server's SQLite calls are
        synchronous, so a server write waiting for our lock stops the whole server, liveness
        answers included (measured on 1.18.33: a 5 s freeze, then `LockTimeoutError`). Checking
        the session's event sequence and rows instead proves no turn recorded anything between
        the re-read and the write; one that did is left for a later pass.
        """
        await self._db.execute("BEGIN")
        try:
            before = await self._snapshot(api, session_id)
        finally:
            await self._db.commit()
        if not before[0]:
            return []
        liveness = await confirm()
        if liveness.active:
            return []
        await self._db.execute("BEGIN IMMEDIATE")
        try:
            if await self._snapshot(api, session_id) != before:
                why = "the session changed after its re-read"
                fields = {"session": session_id, "message": None, "part": None, "mode": "db", "api": str(api)}
                fields |= {"rule": None, "outcome": "skipped", "why": why}
                log.info("write-back of %s skipped: %s", session_id, why, extra={"fields": fields})
                written: list[Written] = []
            else:
                written = await self._runtimes[api].settle(session_id, before[0], liveness, targets)
        except BaseException:
            await self._db.rollback()
            raise
        await self._db.commit()
        return written

    async def _snapshot(self, api: Api, session_id: str) -> tuple[list[JSONObject], int | None]:
        """The session's candidate messages and its event sequence number: any write the server
        makes to the session moves one of them."""
        views = await self._runtimes[api].views(session_id)
        current = await self.rows("SELECT seq FROM event_sequence WHERE aggregate_id = ?", session_id)
        return views, int(current[0][0]) if current else None

    async def update(self, table: str, row_id: str, data: JSONObject, now: int) -> None:
        """Replace a row's data, as the server does (it keeps ids in columns, not in `data`)."""
        await self._db.execute(
            f"UPDATE {table} SET data = ?, time_updated = ? WHERE id = ?",  # table names are constants
            (jsonio.dumps(data).decode(), now, row_id),
        )

    async def append(self, session_id: str, kind: str, data: JSONObject) -> None:
        """Append one durable event at the next sequence number, as the server would."""
        current = await self.rows("SELECT seq FROM event_sequence WHERE aggregate_id = ?", session_id)
        if not current:
            return
        seq = int(current[0][0]) + 1
        await self._db.execute(
            "INSERT INTO event (id, aggregate_id, seq, type, data) VALUES (?, ?, ?, ?, ?)",
            (ascending_id("evt"), session_id, seq, kind, jsonio.dumps(data).decode()),
        )
        await self._db.execute("UPDATE event_sequence SET seq = ? WHERE aggregate_id = ?", (seq, session_id))

    async def rows(self, sql: str, *parameters: Any) -> Sequence[Any]:
        """Every row `sql` selects."""
        async with self._db.execute(sql, parameters) as cursor:
            return list(await cursor.fetchall())


async def _require_tables(connection: aiosqlite.Connection, path: Path, needs: Collection[str]) -> None:
    """Refuse, before anything is written, a file that is not SQLite or lacks opencode's tables
    (a `--db` pointing at the wrong file must not get a table of ours, nor a traceback)."""
    try:
        async with connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'") as cursor:
            names = {row[0] for row in await cursor.fetchall()}
    except sqlite3.Error as error:
        raise NotOpencodeDatabase(f"not an opencode database: {path}: {error}") from None
    if not names & KNOWN_TABLES:
        raise NotOpencodeDatabase(
            f"not an opencode database: {path}: it has none of opencode's tables "
            "(opencode keeps its own in $XDG_DATA_HOME/opencode/opencode.db)"
        )
    if missing := [table for table in needs if table not in names]:
        raise NotOpencodeDatabase(
            f"not an opencode database this proxy settles: {path}: it has no table {', '.join(missing)} "
            "(opencode 1.x's has them all; a 2.x server settles its own)"
        )
