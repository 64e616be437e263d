"""opencode's SQLite store, settled in place: for `--write-back db` and the offline `settle`.

The session's rows are re-read, then the liveness reading is taken, then one short
`BEGIN IMMEDIATE` transaction per session, under a busy timeout, checks that nothing in the
session changed since the re-read and changes only the parts named by the caller that are
still unsettled: the server's own writes are never raced, a turn that started before the
reading is seen in it, one that started after it is seen in the check, and running the same
pass twice changes nothing.

The rows are turned into the API's message shape, the same rules as in the proxy decide,
and the result is turned back, so storage ends up exactly as the views showed it. The
event log is kept in step the way the server keeps it: v1 gets the `message.part.updated`
and `message.updated` events a PATCH would have stored, v2 the `session.next.tool.failed`
event its own interrupt appends, and the v2 message row only what that event projects
(the server leaves the message's `time.completed` to the next step, and so do we).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiosqlite

from proxy.opencode import jsonio
from proxy.opencode.event_log import PROMPT_ADMITTED, call_left_open, tool_failed_data
from proxy.opencode.ids import ascending_id
from proxy.writeback.scheduler import Confirm, Written, targeted
from rules import OPEN_STATUSES, Api, Change, Liveness, OpenTool, apply_changes, settle
from rules.models import JSONObject
from rules.orphaned_tool import OrphanedTool

log = logging.getLogger(__name__)

BUSY_TIMEOUT_MS = 5000
_V1_IDS = ("id", "sessionID", "messageID")
_V2_IDS = ("id", "type")


def default_path(environ: Mapping[str, str]) -> Path:
    """Where opencode keeps its database in `environ`: `$XDG_DATA_HOME/opencode/opencode.db`."""
    data_home = environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "opencode" / "opencode.db"


class OpencodeDatabase:
    """An open connection to `opencode.db`; use `OpencodeDatabase.open(path)`."""

    def __init__(self, connection: aiosqlite.Connection) -> None:
        self._db = connection

    @classmethod
    @asynccontextmanager
    async def open(cls, path: Path) -> AsyncIterator[OpencodeDatabase]:
        """Connect in autocommit mode, so every transaction is an explicit `BEGIN IMMEDIATE`."""
        if not await asyncio.to_thread(path.is_file):
            raise FileNotFoundError(f"no opencode database at {path}")
        async with aiosqlite.connect(path, isolation_level=None) as connection:
            await connection.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            yield cls(connection)

    async def open_tools(self) -> list[OpenTool]:
        """Every tool call recorded as open, of both runtimes, oldest first."""
        found = [
            OpenTool(api, session, message, part, tool, since, directory)
            for api, sql in ((Api.V1, _OPEN_V1_SQL), (Api.V2, _OPEN_V2_SQL))
            for session, directory, message, part, tool, since in await self._rows(sql, *OPEN_STATUSES[api])
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
                log.info("write-back of %s skipped: the session changed after its re-read", session_id)
                written: list[Written] = []
            else:
                settle_api = self._settle_v1 if api is Api.V1 else self._settle_v2
                written = await settle_api(session_id, before[0], liveness, targets)
        except BaseException:
            await self._db.rollback()
            raise
        await self._db.commit()
        return written

    async def _snapshot(self, api: Api, session_id: str) -> tuple[list[JSONObject], int | None]:
        """The session's candidate messages and its event sequence number: any write the server
        makes to the session moves one of them."""
        views = await (self._v1_views if api is Api.V1 else self._v2_views)(session_id)
        current = await self._rows("SELECT seq FROM event_sequence WHERE aggregate_id = ?", session_id)
        return views, int(current[0][0]) if current else None

    async def _v1_views(self, session_id: str) -> list[JSONObject]:
        """The messages of the session with an open tool part, as the API shows them."""
        message_ids = [
            row[0] for row in await self._rows(_V1_OPEN_MESSAGES_SQL, session_id, *OPEN_STATUSES[Api.V1])
        ]
        views = [await self._v1_view(session_id, message_id) for message_id in message_ids]
        return [view for view in views if view is not None]

    async def _v2_views(self, session_id: str) -> list[JSONObject]:
        rows = await self._rows(_V2_CANDIDATES_SQL, session_id)
        return [{"id": message_id, "type": kind, **jsonio.loads(data)} for message_id, kind, data in rows]

    async def _settle_v1(
        self, session_id: str, views: list[JSONObject], liveness: Liveness, targets: Collection[str]
    ) -> list[Written]:
        written: list[Written] = []
        for view in views:
            settlement = settle(view, Api.V1, liveness)
            if settlement is None:
                continue
            now = _now_ms()
            for change in settlement.changes:
                if not targeted(change, targets):
                    continue
                target = change.target
                if change.on_tool:
                    part = settlement.settled(change)
                    await self._update("part", str(target.part), _without(part, _V1_IDS), now)
                    await self._append(
                        session_id,
                        "message.part.updated.1",
                        {"sessionID": session_id, "part": part, "time": now},
                    )
                else:
                    info = settlement.settled(change)
                    await self._update("message", target.message, _without(info, _V1_IDS), now)
                    await self._append(
                        session_id, "message.updated.1", {"sessionID": session_id, "info": info}
                    )
                written.append(Written(Api.V1, session_id, target.message, target.part, change.rule))
        return written

    async def _settle_v2(
        self, session_id: str, views: list[JSONObject], liveness: Liveness, targets: Collection[str]
    ) -> list[Written]:
        written: list[Written] = []
        for view in views:
            # Only what the tool.failed event projects: the message row must stay in step with the log.
            settlement = settle(view, Api.V2, liveness, rules=(OrphanedTool(),))
            if settlement is None:
                continue
            changes = [
                change
                for change in settlement.changes
                if targeted(change, targets) and await self._still_open(session_id, change)
            ]
            if not changes:
                continue
            message_id = changes[0].target.message
            for change in changes:
                data = tool_failed_data(session_id, message_id, settlement.settled(change))
                await self._append(session_id, "session.next.tool.failed.1", data)
                written.append(Written(Api.V2, session_id, message_id, change.target.part, change.rule))
            settled = apply_changes(view, changes)
            await self._update("session_message", message_id, _without(settled, _V2_IDS), _now_ms())
        return written

    async def _still_open(self, session_id: str, change: Change) -> bool:
        call = change.target.call
        call_events = [
            (int(seq), kind) for seq, kind in await self._rows(_V2_CALL_EVENTS_SQL, session_id, call)
        ]
        prompts = [
            int(row[0]) for row in await self._rows(_V2_PROMPTS_SQL, session_id, f"{PROMPT_ADMITTED}.%")
        ]
        return call_left_open(call_events, prompts)

    async def _v1_view(self, session_id: str, message_id: str) -> JSONObject | None:
        message = await self._rows("SELECT data FROM message WHERE id = ?", message_id)
        if not message:
            return None
        parts = await self._rows(_V1_PARTS_SQL, message_id)
        info = {"id": message_id, "sessionID": session_id, **jsonio.loads(message[0][0])}
        return {
            "info": info,
            "parts": [
                {"id": part, "sessionID": session_id, "messageID": message_id, **jsonio.loads(data)}
                for part, data in parts
            ],
        }

    async def _update(self, table: str, row_id: str, data: JSONObject, now: int) -> None:
        await self._db.execute(
            f"UPDATE {table} SET data = ?, time_updated = ? WHERE id = ?",  # table names are constants
            (jsonio.dumps(data).decode(), now, row_id),
        )

    async def _append(self, session_id: str, kind: str, data: JSONObject) -> None:
        """Append one durable event at the next sequence number, as the server would."""
        current = await self._rows("SELECT seq FROM event_sequence WHERE aggregate_id = ?", session_id)
        if not current:
            return
        seq = int(current[0][0]) + 1
        await self._db.execute(
            "INSERT INTO event (id, aggregate_id, seq, type, data) VALUES (?, ?, ?, ?, ?)",
            (ascending_id("evt"), session_id, seq, kind, jsonio.dumps(data).decode()),
        )
        await self._db.execute("UPDATE event_sequence SET seq = ? WHERE aggregate_id = ?", (seq, session_id))

    async def _rows(self, sql: str, *parameters: Any) -> Sequence[Any]:
        async with self._db.execute(sql, parameters) as cursor:
            return list(await cursor.fetchall())


def _without(document: JSONObject, keys: tuple[str, ...]) -> JSONObject:
    return {key: value for key, value in document.items() if key not in keys}


def _now_ms() -> int:
    return int(time.time() * 1000)


_OPEN_V1_SQL = """
SELECT p.session_id, s.directory, p.message_id, p.id, json_extract(p.data, '$.tool'),
       COALESCE(json_extract(p.data, '$.state.time.start'), p.time_created)
FROM part p JOIN session s ON s.id = p.session_id
WHERE json_extract(p.data, '$.type') = 'tool' AND json_extract(p.data, '$.state.status') IN (?, ?)
"""
_OPEN_V2_SQL = """
SELECT m.session_id, s.directory, m.id, json_extract(item.value, '$.id'), json_extract(item.value, '$.name'),
       COALESCE(json_extract(item.value, '$.time.ran'), json_extract(item.value, '$.time.created'),
                m.time_created)
FROM session_message m JOIN session s ON s.id = m.session_id, json_each(m.data, '$.content') item
WHERE json_extract(item.value, '$.type') = 'tool' AND json_extract(item.value, '$.state.status') IN (?, ?)
"""
_V1_OPEN_MESSAGES_SQL = """
SELECT DISTINCT message_id FROM part
WHERE session_id = ? AND json_extract(data, '$.type') = 'tool'
  AND json_extract(data, '$.state.status') IN (?, ?)
"""
_V1_PARTS_SQL = "SELECT id, data FROM part WHERE message_id = ? ORDER BY id"
_V2_CANDIDATES_SQL = (
    "SELECT id, type, data FROM session_message WHERE session_id = ? AND type = 'assistant' ORDER BY seq"
)
_V2_CALL_EVENTS_SQL = """
SELECT seq, type FROM event WHERE aggregate_id = ? AND json_extract(data, '$.callID') = ? ORDER BY seq
"""
_V2_PROMPTS_SQL = "SELECT seq FROM event WHERE aggregate_id = ? AND type LIKE ?"
