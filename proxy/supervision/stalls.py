"""Stalled calls: a tool call the server shows running whose own process has exited while a
process it started still holds its output open, so the server waits for that one (measured on
1.18.33: `sleep 90 & echo started` keeps its bash call running, and the session busy, 90 s).

Detected, never guessed (the peers' lesson, docs/stalled-calls.md): silence alone names nothing,
so a call whose own process lives is never stalled however quiet; a session that waits for a
person (a permission, a question) is never judged; a call without a process of its own (no tie,
:mod:`proxy.supervision.tool_processes`) is not judged. A call is named once its leader has
exited and a holder, known by pid, has held on for `after` seconds: one WARNING, one INFO line
when it ends, `/_settle/health`'s `stalled`, a gauge. With `abort` the call is ended once through
the server's own abort route (1.x `POST /session/{id}/abort`, 2.x `POST /api/session/{id}/interrupt`),
never by killing anything or writing into the database: the server ends the call and the turn
as a person's Stop would, so the turn is not one a crash interrupted and no resume continues it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from proxy.opencode.client import Credentials, UpstreamApi
from proxy.opencode.followed_events import FollowedEvent
from proxy.opencode.sessions import CallOpened, PersonAnswered, PersonAsked
from proxy.opencode.vocabulary import PART_UPDATED, TOOL_RUNNING, tool_status
from proxy.supervision.tool_processes import Group, ToolCall
from proxy.system.process_groups import Member, alive, holding, members
from proxy.system.procfs import program_name

log = logging.getLogger(__name__)
V1, V2_118, LINE_2X = "v1", "v2", "2.x"
"""Where a call lives, which says its session's abort route."""
CHECK_EVERY_S = 1.0


class Calls(Protocol):
    """What the watcher reads of the tied calls (`ToolProcesses`)."""

    def open_groups(self) -> list[tuple[ToolCall, Group]]: ...

    async def server(self) -> int | None: ...


class ProcessTable(Protocol):
    """What the rule reads of the processes (faked in tests)."""

    def alive(self, pid: int, started: int | None) -> bool: ...

    def holders(self, group: Group, server: int | None) -> list[Member]: ...


class LiveTable:
    """/proc: the group's other live processes, and any process whose output is the leader's."""

    def alive(self, pid: int, started: int | None) -> bool:
        return alive(pid, started)

    def holders(self, group: Group, server: int | None) -> list[Member]:
        found = {member.pid: member for member in members(group.leader) if member.pid != group.leader}
        excluded = {group.leader, os.getpid(), *found, *([server] if server is not None else [])}
        for member in holding(group.outputs, excluded):
            found[member.pid] = member
        return [found[pid] for pid in sorted(found)]


def stuck(group: Group, table: ProcessTable, server: int | None) -> list[Member]:
    """What holds a call's output once its own process has exited: nothing while the leader
    lives, or when nothing does (the server is about to end the call itself)."""
    if table.alive(group.leader, group.started):
        return []
    return table.holders(group, server)


@dataclass(slots=True)
class Stall:
    """A call seen stuck, since when, on what; `named` once it has lasted long enough."""

    call: ToolCall
    message: str | None
    since: float
    """Epoch seconds the call was first seen stuck."""
    holders: list[Member]
    named: bool = False
    aborted: bool = False

    def as_json(self) -> dict[str, Any]:
        return {
            "session": self.call.session_id,
            "message": self.message,
            "call": self.call.call,
            "tool": self.call.tool,
            "since": round(self.since * 1000),
            # The program only, as `/_settle/orphans` shows: a command line may hold a secret.
            "holders": [{"pid": each.pid, "program": program_name(each.command)} for each in self.holders],
            "aborted": self.aborted,
        }

    def said(self) -> str:
        held = ", ".join(f"pid {each.pid} ({program_name(each.command)})" for each in self.holders)
        return f"{self.call.tool} call {self.call.call} of session {self.call.session_id}, held by {held}"


Abort = Callable[[str, str, str | None], Awaitable[None]]
"""End a session's turn through the server's route: (session, line, directory); raises on failure."""


def server_abort(upstream: UpstreamApi, credentials: Credentials) -> Abort:
    """The server's own abort of a session's turn: what a person's Stop sends."""

    async def abort(session: str, line: str, directory: str | None) -> None:
        if line == V1:
            params = {"directory": directory} if directory else None
            await upstream.call("POST", f"/session/{session}/abort", credentials, params=params)
        else:
            await upstream.call("POST", f"/api/session/{session}/interrupt", credentials, json={})

    return abort


@dataclass(slots=True)
class _Heard:
    """What the stream said of the calls and sessions of this server's life."""

    calls: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    """Each call opened: its line and message."""
    directories: dict[str, str] = field(default_factory=dict)
    asked: dict[str, set[str]] = field(default_factory=dict)
    """Each session's requests that wait for a person."""


class Stalls:
    """A `StreamListener` that names stalled calls, and ends each once when asked to."""

    tasks = None

    def __init__(
        self,
        processes: Calls,
        *,
        after: float,
        abort: Abort | None = None,
        table: ProcessTable | None = None,
        clock: Callable[[], float] = time.time,
        aborts: Callable[[str], None] = lambda _: None,
    ) -> None:
        self._processes, self._after, self._abort = processes, after, abort
        self._table = table if table is not None else LiveTable()
        self._clock, self._aborts = clock, aborts
        self._heard = _Heard()
        self._seen: dict[str, Stall] = {}
        self._said_unjudged = False
        self._task: asyncio.Task[None] | None = None

    @property
    def stalled(self) -> list[Stall]:
        """The calls named stalled now."""
        return [stall for stall in self._seen.values() if stall.named]

    def following(self) -> None:
        """The stream is back, perhaps from a new server: what it said before is not this life's."""
        self._heard = _Heard()

    def event(self, event: FollowedEvent) -> None:
        heard = self._heard
        if (session := event.session_id) is not None and event.directory:
            heard.directories[session] = event.directory
        part = event.properties.get("part")
        if event.kind == PART_UPDATED and isinstance(part, dict) and tool_status(part) == TOOL_RUNNING:
            heard.calls.setdefault(str(part.get("id")), (V1, str(part.get("messageID"))))
        for change in event.transitions:
            if isinstance(change, CallOpened):
                line = LINE_2X if change.line_2x else V2_118
                heard.calls.setdefault(change.call_id, (line, change.message_id))
            elif isinstance(change, PersonAsked):
                heard.asked.setdefault(change.session_id, set()).add(change.request)
            elif isinstance(change, PersonAnswered):
                heard.asked.get(change.session_id, set()).discard(change.request)

    def start(self) -> None:
        self._task = asyncio.create_task(self._watch(), name="stalled calls")

    async def close(self) -> None:
        if (task := self._task) is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _watch(self) -> None:
        while True:
            try:
                await self.check()
            except Exception as error:  # the next look may succeed; a failed one names nothing new
                log.warning("looking for stalled calls failed: %s", error)
            await asyncio.sleep(CHECK_EVERY_S)

    async def check(self) -> None:
        """One look: name the calls stuck for long enough, and say which are no longer."""
        heard, now = self._heard, self._clock()
        server = await self._processes.server()
        if server is None and heard.calls:
            self._unjudged()
        stuck_now: dict[str, list[Member]] = {}
        for call, group in self._processes.open_groups():
            judged = call.call in heard.calls and not heard.asked.get(call.session_id)
            if judged and (holders := stuck(group, self._table, server)):
                stuck_now[call.call] = holders
                self._stuck(call, holders, now)
        for key in [key for key in self._seen if key not in stuck_now]:
            self._ended(self._seen.pop(key))
        for stall in list(self._seen.values()):
            if not stall.named and now - stall.since >= self._after:
                await self._named(stall)

    def _stuck(self, call: ToolCall, holders: list[Member], now: float) -> None:
        if (known := self._seen.get(call.call)) is not None:
            known.holders = holders
            return
        message = self._heard.calls[call.call][1]
        self._seen[call.call] = Stall(call, message, now, holders)

    async def _named(self, stall: Stall) -> None:
        stall.named = True
        fields = stall.as_json()
        log.warning(
            "stalled call: %s; its own process has exited, so it can no longer finish by itself%s",
            stall.said(),
            "" if self._abort else " (--stall-abort ends it)",
            extra={"fields": fields},
        )
        if self._abort is not None:
            await self._ended_by_abort(stall, self._abort)

    async def _ended_by_abort(self, stall: Stall, abort: Abort) -> None:
        call = stall.call
        line = self._heard.calls[call.call][0]
        stall.aborted = True  # once, whatever the server answers
        try:
            await abort(call.session_id, line, self._heard.directories.get(call.session_id))
        except Exception as error:
            self._aborts("failed")
            log.warning("the server's abort of stalled call %s failed: %s", call.call, error)
            return
        self._aborts("sent")
        log.warning(
            "stalled call %s ended through the server's abort of session %s", call.call, call.session_id
        )

    def _ended(self, stall: Stall) -> None:
        if stall.named:
            log.info("call %s of session %s is no longer stalled", stall.call.call, stall.call.session_id)

    def _unjudged(self) -> None:
        if not self._said_unjudged:
            self._said_unjudged = True
            log.warning("stalled calls are not judged: the server's process is not found on this host")
