"""`--write-back api`: settlements written through the server's own API, so that every
connected client hears of them.

Each pass re-reads the session, then takes the reading it rests on (so that reading is later
than everything it judges), and writes only the parts or calls the fetch named that are still
open and that the reading vouches for.

v1: `PATCH /session/{sid}/message/{mid}/part/{pid}` with the whole settled part. The route
upserts, so only a part read an instant before is ever sent. The API cannot set a v1
message's `time.completed`; that stays a view-only settlement.

v2: `POST /sync/replay` with a `session.next.tool.failed.1` event at the next sequence
number. Measured on 1.18.33: a sequence number already taken or one that leaves a gap is
refused (HTTP 500 `UnknownError`) and nothing is stored; the next free one is accepted; a
second failure of the same call is accepted too (no duplicate check). A prompt admitted
in the session (`session.next.prompt.admitted`) makes the server append its own
`tool.failed` for every open call right after it, so a prompt that lands between our read
and our append takes our sequence number (refused), and the re-read finds the call failed
by the server. The other order is safe too: after our `tool.failed`, the server's next
prompt appends no second one. So the log is read just before the append (`session_logs`),
the call must still be open there, and a refusal means the server appended concurrently: the
log is read again and the append retried at the new next number, or dropped when the call is
no longer open. Never a gap, never a duplicate.

v1 has no such check: PATCH is a plain upsert (no version, no precondition), so two proxies
in front of one server that both read the part before either PATCHes both PATCH it.
Measured on 1.18.33 (two `--write-back api` proxies fetching one stale v1 session at once):
the part was PATCHed twice in 8 and in 15 of 20 trials (two runs), i.e. two
`message.part.updated.1` events were stored and every client was told twice. The only
compare-and-set the API offers is `/sync/replay`'s seq check, and a replayed
`message.part.updated.1` does settle a v1 part exactly once, but it is published on no event
stream (measured), so clients would keep spinning; PATCH stays. Instead, the re-read and
the PATCHes of a v1 session run under `SessionLocks`: an `flock` on a lock file that every
proxy of the user on the host finds at the same path. The second writer re-reads after the
first has PATCHed and finds nothing left to write. The kernel drops the lock of a process
that dies (SIGKILL included), so no stale lock ever blocks a later pass. Proxies on
different hosts (or under different users) share no lock and can still write a v1 part
twice, with the same content.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxy.opencode.client import Credentials, UpstreamApi, UpstreamRefused
from proxy.opencode.event_log import call_left_open
from proxy.opencode.runtimes import V1_HTTP, V2_HTTP
from proxy.opencode.vocabulary import PROMPT_ADMITTED, event_name, for_replay, tool_failed
from proxy.writeback.locks import SessionLocks
from proxy.writeback.modes import WriteBackMode
from proxy.writeback.scheduler import Confirm, Written, targeted
from proxy.writeback.session_logs import LogEvent, SessionLogs
from rules import REGISTRY, Api, Change, JSONObject, Liveness, OrphanedTool, Target, settle

log = logging.getLogger(__name__)

_APPEND_ATTEMPTS = 3
_PAGE = 200
_MAX_PAGES = 100


@dataclass(slots=True)
class _Log:
    """What the session's event log says right now."""

    last_seq: int
    events: list[LogEvent]

    def call_open(self, call: str) -> bool:
        calls = [(seq, name) for seq, name, call_id in self.events if call_id == call]
        prompts = [seq for seq, name, _ in self.events if name == PROMPT_ADMITTED]
        return call_left_open(calls, prompts)


class ApiWriter:
    """Writes through the upstream with the credentials of the client whose fetch found the orphan."""

    mode = WriteBackMode.API

    def __init__(self, upstream: UpstreamApi, locks: SessionLocks, *, database: Path | None = None) -> None:
        self._upstream = upstream
        self._locks = locks
        self._logs = SessionLogs(upstream, database)
        self._writers = {V1_HTTP.api: self._write_v1, V2_HTTP.api: self._write_v2}

    async def write(
        self, api: Api, session_id: str, credentials: Credentials, targets: Collection[str], confirm: Confirm
    ) -> list[Written]:
        return await self._writers[api](session_id, credentials, targets, confirm)

    async def _write_v1(
        self, session_id: str, credentials: Credentials, targets: Collection[str], confirm: Confirm
    ) -> list[Written]:
        """Re-read, confirm and PATCH under the session's lock, so that no other proxy reads in between."""
        async with self._locks.hold(session_id):
            return await self._patch_v1(session_id, credentials, targets, confirm)

    async def _patch_v1(
        self, session_id: str, credentials: Credentials, targets: Collection[str], confirm: Confirm
    ) -> list[Written]:
        messages = await self._upstream.get(V1_HTTP.messages_path(session_id), credentials)
        liveness = await confirm()
        written = []
        for message in messages:
            settlement = settle(message, V1_HTTP.api, liveness, rules=REGISTRY.durable(V1_HTTP.api))
            if settlement is None:
                continue
            for change in settlement.changes:
                target = change.target
                if not change.on_tool or not targeted(change, targets):
                    continue
                path = f"{V1_HTTP.messages_path(session_id, target.message)}/part/{target.part}"
                await self._upstream.call("PATCH", path, credentials, json=settlement.settled(change))
                written.append(Written(V1_HTTP.api, session_id, target.message, target.part, change.rule))
        return written

    async def _write_v2(
        self, session_id: str, credentials: Credentials, targets: Collection[str], confirm: Confirm
    ) -> list[Written]:
        messages = [message async for message in self._v2_messages(session_id, credentials)]
        calls = _open_calls(messages, await confirm(), targets)
        if not calls:
            return []
        info = await self._upstream.get(f"/api/session/{session_id}", credentials)
        directory = info["data"]["location"]["directory"]
        event_log = await self._read_log(session_id, credentials)
        written = []
        for change, item in calls:
            call = change.target
            if await self._append_failure(
                session_id, directory, call, item, event_log=event_log, credentials=credentials
            ):
                written.append(Written(V2_HTTP.api, session_id, call.message, call.part, change.rule))
        return written

    async def _append_failure(
        self,
        session_id: str,
        directory: str,
        call: Target,
        item: JSONObject,
        *,
        event_log: _Log,
        credentials: Credentials,
    ) -> bool:
        """Append `tool.failed` for the settled `item` while the log still shows `call` open."""
        for _ in range(_APPEND_ATTEMPTS):
            if not event_log.call_open(str(call.call)):
                return False
            failed = tool_failed(session_id, call.message, item)
            event = for_replay(failed, session_id, event_log.last_seq + 1)
            try:
                await self._upstream.call(
                    "POST", "/sync/replay", credentials, json={"directory": directory, "events": [event]}
                )
            except UpstreamRefused as refusal:
                why = f"replay at seq {event['seq']} refused ({refusal}): the server appended meanwhile"
                fields = _fields(session_id, call, "retried", why)
                log.info("%s; re-reading the log of %s", why, session_id, extra={"fields": fields})
                fresh = await self._read_log(session_id, credentials)
                event_log.last_seq, event_log.events = fresh.last_seq, fresh.events
                continue
            event_log.last_seq += 1
            event_log.events.append((event_log.last_seq, event_name(event["type"]), call.call))
            return True
        why = f"gave up appending tool.failed after {_APPEND_ATTEMPTS} attempts: the log kept moving"
        log.warning(
            "%s for %s in %s",
            why,
            call.call,
            session_id,
            extra={"fields": _fields(session_id, call, "skipped", why)},
        )
        return False

    async def _v2_messages(self, session_id: str, credentials: Credentials) -> AsyncIterator[Any]:
        """Every message, newest first, following the list's cursor."""
        params = {"limit": str(_PAGE)}
        for _ in range(_MAX_PAGES):
            page = await self._upstream.get(V2_HTTP.messages_path(session_id), credentials, **params)
            for message in page["data"]:
                yield message
            cursor = (page.get("cursor") or {}).get("next")
            if len(page["data"]) < _PAGE or not cursor:
                return
            params = {"limit": str(_PAGE), "cursor": cursor}

    async def _read_log(self, session_id: str, credentials: Credentials) -> _Log:
        """What the session's log says right now (`SessionLogs`)."""
        events = await self._logs.read(session_id, credentials)
        return _Log(max((seq for seq, _, _ in events), default=0), events)


def _open_calls(
    messages: list[Any], liveness: Liveness, targets: Collection[str]
) -> list[tuple[Change, JSONObject]]:
    """The named calls open in `messages` that the reading vouches are orphaned, each with its
    item as the rule settled it (its `time.completed` is the failure time)."""
    calls = []
    for message in messages:
        settlement = settle(message, V2_HTTP.api, liveness, rules=REGISTRY.durable(V2_HTTP.api))
        if settlement is None:
            continue
        calls += [
            (change, settlement.settled(change)) for change in settlement.changes if targeted(change, targets)
        ]
    return calls


def _fields(session_id: str, call: Target, outcome: str, why: str) -> dict[str, object]:
    """A v2 append's decision, with the fields of every write-back decision (`decisions`)."""
    return {
        "session": session_id,
        "message": call.message,
        "part": call.part,
        "mode": str(WriteBackMode.API),
        "api": str(V2_HTTP.api),
        "rule": OrphanedTool.name,
        "outcome": outcome,
        "why": why,
    }
