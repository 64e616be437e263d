"""Each runtime's rows in `opencode.db`: read as the API's message shape, settled, written back.

opencode keeps v1 messages as a `message` row plus one `part` row per part, and v2 messages
as one `session_message` row holding its `content`. Each class here turns one runtime's rows
into the view the rules judge, and writes the settlement back with the event the server
itself would have appended, so storage ends up exactly as the views showed it and the event
log stays in step. `OpencodeDatabase` owns the connection and the transaction around them.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterator, Sequence
from typing import Any, ClassVar, Protocol

from proxy.opencode import jsonio
from proxy.opencode.event_log import call_left_open
from proxy.opencode.vocabulary import (
    MESSAGE_UPDATED,
    OPEN_STATUSES,
    PART_UPDATED,
    PROMPT_ADMITTED,
    TOOL_FAILED,
    durable_type,
    tool_failed_data,
)
from proxy.writeback.scheduler import Written, targeted
from rules import (
    REGISTRY,
    V1,
    V2,
    Api,
    Change,
    JSONObject,
    Liveness,
    Runtime,
    Settlement,
    apply_changes,
    settle,
)

_V1_IDS = ("id", "sessionID", "messageID")
_V2_IDS = ("id", "type")


class Store(Protocol):
    """What a runtime's rows need of the connection."""

    async def rows(self, sql: str, *parameters: Any) -> Sequence[Any]: ...

    async def update(self, table: str, row_id: str, data: JSONObject, now: int) -> None: ...

    async def append(self, session_id: str, kind: str, data: JSONObject) -> None: ...


class RuntimeRows(Protocol):
    """One runtime's rows: its open tools, its candidate views, and how a settlement is written."""

    runtime: ClassVar[Runtime[Any]]
    open_tools_sql: ClassVar[str]
    """(session, directory, message, part or call, tool, last alive) of every open tool call;
    its parameters are the runtime's open statuses."""

    async def views(self, session_id: str) -> list[JSONObject]: ...

    async def settle(
        self, session_id: str, views: list[JSONObject], liveness: Liveness, targets: Collection[str]
    ) -> list[Written]: ...


class V1Rows:
    """v1: a PATCH's effect, part by part: the row, and `message.part.updated` (or
    `message.updated` for the message itself) in the log."""

    runtime: ClassVar[Runtime[Any]] = V1
    open_tools_sql: ClassVar[str] = """
SELECT p.session_id, s.directory, p.message_id, p.id, json_extract(p.data, '$.tool'),
       COALESCE(json_extract(p.data, '$.state.time.start'), p.time_created)
FROM part p JOIN session s ON s.id = p.session_id
WHERE json_extract(p.data, '$.type') = 'tool' AND json_extract(p.data, '$.state.status') IN (?, ?)
"""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def views(self, session_id: str) -> list[JSONObject]:
        """The messages of the session with an open tool part, as the API shows them."""
        open_statuses = sorted(OPEN_STATUSES[V1.api])
        message_ids = [
            row[0] for row in await self._store.rows(_V1_OPEN_MESSAGES_SQL, session_id, *open_statuses)
        ]
        views = [await self._view(session_id, message_id) for message_id in message_ids]
        return [view for view in views if view is not None]

    async def settle(
        self, session_id: str, views: list[JSONObject], liveness: Liveness, targets: Collection[str]
    ) -> list[Written]:
        written: list[Written] = []
        for _, settlement in _settlements(views, V1.api, liveness):
            now = now_ms()
            for change in settlement.changes:
                if not targeted(change, targets):
                    continue
                target, settled = change.target, settlement.settled(change)
                if change.on_tool:
                    await self._store.update("part", str(target.part), _without(settled, _V1_IDS), now)
                    data = {"sessionID": session_id, "part": settled, "time": now}
                    await self._store.append(session_id, durable_type(PART_UPDATED), data)
                else:
                    await self._store.update("message", target.message, _without(settled, _V1_IDS), now)
                    data = {"sessionID": session_id, "info": settled}
                    await self._store.append(session_id, durable_type(MESSAGE_UPDATED), data)
                written.append(Written(V1.api, session_id, target.message, target.part, change.rule))
        return written

    async def _view(self, session_id: str, message_id: str) -> JSONObject | None:
        message = await self._store.rows("SELECT data FROM message WHERE id = ?", message_id)
        if not message:
            return None
        parts = await self._store.rows(_V1_PARTS_SQL, message_id)
        info = {"id": message_id, "sessionID": session_id, **jsonio.loads(message[0][0])}
        return {
            "info": info,
            "parts": [
                {"id": part, "sessionID": session_id, "messageID": message_id, **jsonio.loads(data)}
                for part, data in parts
            ],
        }


class V2Rows:
    """v2: the `session.next.tool.failed` event the server's own interrupt appends, and the
    message row only what that event projects (the server leaves the message's
    `time.completed` to the next step, and so do we)."""

    runtime: ClassVar[Runtime[Any]] = V2
    open_tools_sql: ClassVar[str] = """
SELECT m.session_id, s.directory, m.id, json_extract(item.value, '$.id'), json_extract(item.value, '$.name'),
       COALESCE(json_extract(item.value, '$.time.ran'), json_extract(item.value, '$.time.created'),
                m.time_created)
FROM session_message m JOIN session s ON s.id = m.session_id, json_each(m.data, '$.content') item
WHERE json_extract(item.value, '$.type') = 'tool' AND json_extract(item.value, '$.state.status') IN (?, ?)
"""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def views(self, session_id: str) -> list[JSONObject]:
        rows = await self._store.rows(_V2_CANDIDATES_SQL, session_id)
        return [{"id": message_id, "type": kind, **jsonio.loads(data)} for message_id, kind, data in rows]

    async def settle(
        self, session_id: str, views: list[JSONObject], liveness: Liveness, targets: Collection[str]
    ) -> list[Written]:
        written: list[Written] = []
        # Only what the tool.failed event projects: the message row must stay in step with the log.
        for view, settlement in _settlements(views, V2.api, liveness):
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
                await self._store.append(session_id, durable_type(TOOL_FAILED), data)
                written.append(Written(V2.api, session_id, message_id, change.target.part, change.rule))
            settled = apply_changes(view, changes)
            await self._store.update("session_message", message_id, _without(settled, _V2_IDS), now_ms())
        return written

    async def _still_open(self, session_id: str, change: Change) -> bool:
        call = change.target.call
        call_events = [
            (int(seq), kind) for seq, kind in await self._store.rows(_V2_CALL_EVENTS_SQL, session_id, call)
        ]
        prompts = [
            int(row[0]) for row in await self._store.rows(_V2_PROMPTS_SQL, session_id, f"{PROMPT_ADMITTED}.%")
        ]
        return call_left_open(call_events, prompts)


def _settlements(
    views: list[JSONObject], api: Api, liveness: Liveness
) -> Iterator[tuple[JSONObject, Settlement]]:
    """Each view the rules that make a durable change in `api` change, with what they change."""
    for view in views:
        if (settlement := settle(view, api, liveness, rules=REGISTRY.durable(api))) is not None:
            yield view, settlement


def _without(document: JSONObject, keys: tuple[str, ...]) -> JSONObject:
    return {key: value for key, value in document.items() if key not in keys}


def now_ms() -> int:
    return int(time.time() * 1000)


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
