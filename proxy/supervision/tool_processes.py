"""Which process runs which tool call, recorded while the server lives, so that what a crash
leaves behind can be named, and on request ended, exactly.

opencode's bash tool starts every command as the leader of a process group of its own, a direct
child of the server (1.18's v1 runs the command itself, its v2 a `/bin/sh -c`). 2.x's `shell` tool
runs `<shell> -c <command>` with the user's shell (`packages/core/src/shell.ts` `Shell.create`
@9e3d245ca256, `ShellSelect.args` in `shell/select.ts` @27004baa8387), which bash and dash replace
with the command itself when it is a single one: a 2.x call fits either. When the event stream
shows a call start (1.18's `message.part.updated` and `session.next.tool.called`, 2.x's
`session.tool.called`), the server's new group leaders are tied to it, each by its pid *and* its
start time (clock ticks since boot, from /proc): a pid the kernel hands out again later never
matches, and nothing is ever matched by its name alone. A leader that cannot be tied to exactly
one call is not tied to any: it is only ever reported.

A command that starts something in the background and exits at once (`sleep 90 & echo started`)
is often gone before the first look: measured on 1.18.33 and 2.1.2, its leader lived a few
milliseconds. Its group lives on in what it started, so a group whose leader has exited, all of
whose processes started after a call was heard of, children of the server or of whoever adopted
them, is tied to that call when it is the only one that fits (`Group.leader_seen` false). Each
tie keeps the call's group and the files its leader's output went to (`Group`), for
:mod:`proxy.supervision.stalls`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, replace
from typing import Any, Protocol

from proxy.opencode.events_2x import api_call_id
from proxy.opencode.sessions import PersonAnswered, PersonAsked
from proxy.opencode.tracker import FollowedEvent
from proxy.opencode.vocabulary import (
    API_CALL_ENDED,
    API_CALL_STARTED,
    API_INPUT_STARTED,
    CALL_ENDED,
    CALL_STARTED,
    PART_UPDATED,
    PERSON_PREFIXES,
    TOOL_RUNNING,
    is_open_tool,
    tool_status,
)
from proxy.relay.bounded import Bounded
from proxy.system.open_files import FileId
from proxy.system.process_groups import Member, leaderless, outputs
from proxy.system.procfs import command_line, pids, program_name, stat, ticks_since_boot
from rules import Api

_SCAN_AFTER_S = (0.2, 1.0, 3.0)
"""When to look for a started call's process: it may start a moment after the call is announced."""
_REMEMBERED = 10_000
_HEARD_MARGIN_S = 1.0
"""How much earlier than the stream's word of a call its process may have started."""
_SHELL = re.compile(r"(?:\S*/)?(?:ba|da|k|z)?sh -c ")
"""How a shell-run command's leader reads: `/bin/sh -c …` (1.18's v2), `/usr/bin/bash -c …` (2.x)."""
DIRECT, SHELL = "direct", "shell"
"""How a call's process runs its command: as itself, or as the script of a shell's `-c`."""
_WAYS = {Api.V1: frozenset({DIRECT}), Api.V2: frozenset({SHELL})}
_EITHER = frozenset({DIRECT, SHELL})
log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Identity:
    """A process, told apart from any later process that gets the same pid."""

    pid: int
    started: int
    """Start time in clock ticks since boot (/proc/PID/stat field 22)."""

    @classmethod
    def of(cls, pid: int) -> Identity | None:
        found = stat(pid)
        return cls(pid, found.started) if found else None


@dataclass(frozen=True, slots=True)
class Group:
    """The process group a call's command leads, and the files its leader's output went to."""

    leader: int
    """The leader's pid: the group's id."""
    started: int | None
    """The leader's start time; None when it had exited before it was seen (`leader_seen` false)."""
    outputs: frozenset[FileId] = frozenset()

    @property
    def leader_seen(self) -> bool:
        return self.started is not None


@dataclass(slots=True)
class ToolCall:
    """A tool call the stream showed, and whether it was still running when last heard of."""

    session_id: str
    call: str
    """The v1 part id, or the v2 call id."""
    tool: str
    command: str
    running: bool = True


@dataclass(frozen=True, slots=True)
class Orphan:
    """A process the dead server left running, and the call that started it, when known."""

    pid: int
    command: str
    call: ToolCall | None

    @property
    def call_was_running(self) -> bool:
        """Whether its call was still running at the crash (only such processes may be ended)."""
        return self.call is not None and self.call.running

    def as_json(self) -> dict[str, Any]:
        call = self.call
        return {
            "pid": self.pid,
            # The program only: a tool's command line may hold what a client of the proxy must not see.
            "program": program_name(self.command),
            "session": call.session_id if call else None,
            "part": call.call if call else None,
            "tool": call.tool if call else None,
            "call_was_running": self.call_was_running,
        }


class Recorder(Protocol):
    """Where ties are kept beyond the proxy's life (`proxy.supervision.process_records`)."""

    async def record(self, process: Identity, command: str, server: Identity, call: ToolCall) -> None: ...

    async def ended(self, call: str) -> None: ...

    async def left_running(self) -> list[Any]: ...


ServerLocator = Callable[[], Awaitable[int | None]]
"""Finds the server's pid now: the child `settle-proxy run` started, or the process listening on
the upstream's port."""


class ToolProcesses:
    """A `StreamListener` that ties the server's tool processes to the calls that started them."""

    def __init__(self, locate_server: ServerLocator, *, reports: bool = False) -> None:
        self._locate_server = locate_server
        self._reports = reports
        """Whether to report recorded processes that outlived their server when the stream comes
        back (a proxy in front of a server it did not start; `run` reports what it adopts itself)."""
        self.recorder: Recorder | None = None
        self._reported: Bounded[Identity, None] = Bounded(_REMEMBERED)
        self._writes: set[asyncio.Task[None]] = set()
        self._calls: Bounded[str, ToolCall] = Bounded(_REMEMBERED, forgotten=self._forgotten)
        self._ways: dict[str, frozenset[str]] = {}
        self._names: Bounded[str, str] = Bounded(_REMEMBERED)
        """2.x's tool of each call whose input began: `session.tool.called` names none."""
        self._awaiting: set[str] = set()
        self._processes: Bounded[Identity, str] = Bounded(_REMEMBERED)
        self._groups: Bounded[str, Group] = Bounded(_REMEMBERED)
        """The group of each tied call."""
        self._heard: Bounded[str, int] = Bounded(_REMEMBERED)
        """When each call was heard of, in clock ticks since boot less `_HEARD_MARGIN_S`."""
        self._paused: dict[str, set[str]] = {}
        """The calls of each session that waits for a person, not awaited until they answer."""
        self._at_crash: Bounded[Identity, ToolCall] = Bounded(_REMEMBERED)
        """The call of each process a dead server left, as it was at that crash: the call may end
        in a later server's life, but the process was left by a crash all the same."""

    def following(self) -> None:
        """The stream is back, perhaps after a crash: say which recorded processes outlived their server."""
        if self._reports:
            self._write(self._report_left_running())

    async def left_running(self) -> list[Orphan]:
        """The recorded processes that outlived the server that started them."""
        if self.recorder is None:
            return []
        return [
            Orphan(found.process.pid, found.command, found.call)
            for found in await self.recorder.left_running()
        ]

    async def _report_left_running(self) -> None:
        for orphan in self.first_found(await self.left_running()):
            log.warning("orphaned process %s", described(orphan), extra={"fields": orphan.as_json()})

    def first_found(self, orphans: list[Orphan]) -> list[Orphan]:
        """Those of `orphans` found for the first time: each running process is reported once."""
        found = []
        for orphan in orphans:
            identity = Identity.of(orphan.pid)
            if identity is not None and identity not in self._reported:
                self._reported[identity] = None
                found.append(orphan)
        return found

    def event(self, event: FollowedEvent) -> None:
        if event.kind.startswith(PERSON_PREFIXES):
            self._person(event)
        if event.kind == PART_UPDATED:
            self._v1_part(event.properties.get("part"))
        elif event.kind == CALL_STARTED or event.kind in CALL_ENDED:
            self._v2_call(event)
        elif event.kind in (API_INPUT_STARTED, API_CALL_STARTED, *API_CALL_ENDED):
            self._api_call(event)

    def orphans(self, pids: list[int]) -> list[Orphan]:
        """What `pids` (processes adopted from dead servers) were started for, each call as it was
        when the process was first found orphaned."""
        found = []
        for pid in pids:
            identity = Identity.of(pid)
            if identity is None:
                continue
            call = self._at_crash.get(identity)
            if call is None and (key := self._processes.get(identity)) and (known := self._calls.get(key)):
                call = self._at_crash[identity] = replace(known)
            found.append(Orphan(pid, command_line(pid), call))
        return found

    def open_groups(self) -> list[tuple[ToolCall, Group]]:
        """The calls the stream still shows running, each with the group tied to it."""
        return [
            (known, group)
            for call, group in self._groups.items()
            if (known := self._calls.get(call)) is not None and known.running
        ]

    async def server(self) -> int | None:
        """The server's pid now, if it can be found on this host."""
        return await self._locate_server()

    def tied(self, call: str) -> bool:
        """Whether a process was tied to `call` (the v1 part id, or the v2 call id)."""
        return call in self._processes.values()

    def _person(self, event: FollowedEvent) -> None:
        """A call whose session waits for a person starts no process until they answer: it is
        not awaited meanwhile (a group found then is not its), and is awaited anew once answered."""
        for change in event.transitions:
            if isinstance(change, PersonAsked):
                held = {call for call in self._awaiting if self._session_of(call) == change.session_id}
                self._paused.setdefault(change.session_id, set()).update(held)
                self._awaiting -= held
            elif isinstance(change, PersonAnswered) and (held := self._paused.pop(change.session_id, set())):
                for call in held:
                    self._heard[call] = _heard_now()
                self._awaiting |= {call for call in held if call in self._calls}
                self._write(self._tie())

    def _session_of(self, call: str) -> str | None:
        return known.session_id if (known := self._calls.get(call)) is not None else None

    def _v1_part(self, part: Any) -> None:
        if not isinstance(part, dict) or not isinstance(part.get("id"), str):
            return
        if tool_status(part) == TOOL_RUNNING:
            command = (part["state"].get("input") or {}).get("command")
            session, tool = str(part.get("sessionID")), str(part.get("tool"))
            self._started(_WAYS[Api.V1], session, part["id"], tool, command)
        elif not is_open_tool(part, Api.V1):
            self._ended(part["id"])

    def _v2_call(self, event: FollowedEvent) -> None:
        call = event.properties.get("callID")
        if not isinstance(call, str):
            return
        if event.kind == CALL_STARTED:
            command = (event.properties.get("input") or {}).get("command")
            tool = str(event.properties.get("tool"))
            self._started(_WAYS[Api.V2], str(event.session_id), call, tool, command)
        else:
            self._ended(call)

    def _api_call(self, event: FollowedEvent) -> None:
        """2.x: the call is `data.id` (newer) or `data.callID` (older); its tool is named only when
        its input begins (`Tool.Input.Started`, `packages/schema/src/session-event.ts` @03130971e20a)."""
        found = api_call_id(event.properties)
        if found is None:
            return
        _, call = found
        if event.kind == API_INPUT_STARTED:
            if isinstance(name := event.properties.get("name"), str):
                self._names[call] = name
        elif event.kind == API_CALL_STARTED:
            command = (event.properties.get("input") or {}).get("command")
            tool = self._names.get(call) or str(event.properties.get("name") or "unknown")
            self._started(_EITHER, str(event.session_id), call, tool, command)
        else:
            self._ended(call)
            self._names.pop(call, None)

    def _started(self, ways: frozenset[str], session_id: str, call: str, tool: str, command: Any) -> None:
        if call in self._calls or not isinstance(command, str):
            return  # only calls that run a command start processes; a repeated update starts nothing
        log.debug("call %s started (%s): %r", call, "/".join(sorted(ways)), command)
        self._calls[call] = ToolCall(session_id, call, tool, command)
        self._heard[call] = _heard_now()
        self._ways[call] = ways
        self._awaiting.add(call)
        self._write(self._tie())

    def _forgotten(self, call: str, _: ToolCall) -> None:
        """A call forgotten to make room for newer ones (past `_REMEMBERED`) waits for no process."""
        self._ways.pop(call, None)
        self._groups.pop(call, None)
        self._awaiting.discard(call)

    async def _tie(self) -> None:
        """Look for the processes of the calls that wait for one, a few times as they may start late."""
        waited = 0.0
        for moment in _SCAN_AFTER_S:
            await asyncio.sleep(moment - waited)
            waited = moment
            if not self._awaiting:
                return
            server = await self._locate_server()
            if server is not None:
                self._scan(server)

    def _ended(self, call: str) -> None:
        if (known := self._calls.get(call)) is not None and known.running:
            known.running = False
            if self.recorder is not None:
                self._write(self.recorder.ended(call))
        self._awaiting.discard(call)

    async def flush(self) -> None:
        """Wait until every tie is on disk."""
        while self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)

    def _write(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._writes.add(task)
        task.add_done_callback(self._written)

    def _written(self, task: asyncio.Task[None]) -> None:
        self._writes.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            log.warning("tool process bookkeeping failed: %s", error)

    def _scan(self, server_pid: int) -> None:
        """Tie the server's group leaders not yet known to the calls that wait for a process."""
        known = set(self._processes)
        server = Identity.of(server_pid)
        for identity in _group_leaders_below(server_pid):
            if identity in known:
                continue
            command = command_line(identity.pid)
            call = self._call_for(command)
            log.debug("server's process group %d (%s): call %s", identity.pid, command[:80], call)
            if call is not None:
                self._processes[identity] = call
                self._groups[call] = Group(identity.pid, identity.started, outputs(identity.pid))
                self._awaiting.discard(call)
                if self.recorder is not None and server is not None:
                    self._write(self.recorder.record(identity, command, server, self._calls[call]))
        if self._awaiting:
            self._tie_leaderless(server_pid)

    def _tie_leaderless(self, server_pid: int) -> None:
        """Tie the groups whose leader exited before it was seen, each to the one call it fits."""
        known = {group.leader for group in self._groups.values()}
        since = min((self._heard.get(call, 0) for call in self._awaiting), default=0)
        parents = {server_pid, os.getpid(), 1}
        if (server := stat(server_pid)) is not None:
            parents.add(server.parent)
        for group, members in leaderless(parents, since).items():
            if group in known or (call := self._call_of_group(members)) is None:
                continue
            log.debug("group %d, its leader gone (%s): call %s", group, members[0].command[:80], call)
            self._groups[call] = Group(group, None)
            self._awaiting.discard(call)

    def _call_of_group(self, members: list[Member]) -> str | None:
        """The one waiting call heard of before every process of a group started; of several, the
        one whose command holds one of theirs."""
        first = min(member.started for member in members)
        fitting = [call for call in self._awaiting if self._heard.get(call, first + 1) <= first]
        if len(fitting) > 1:
            ran = [member.command for member in members if member.command not in ("", "?")]
            fitting = [call for call in fitting if any(each in self._calls[call].command for each in ran)]
        return fitting[0] if len(fitting) == 1 else None

    def _call_for(self, command: str) -> str | None:
        """The one waiting call whose command this process runs: as a shell's script (1.18's v2,
        2.x), or as itself (1.18's v1, where for `a && b` the leader runs `b`; 2.x, whose shell
        replaced itself). Another child of the server (a language server, a plugin) fits no
        call, and a process that fits two fits none."""
        shell = _SHELL.match(command)
        ran = command[shell.end() :] if shell else command
        if not ran:
            return None  # an ending process's command line reads empty, and would fit every call
        way = SHELL if shell else DIRECT
        fitting = [
            call
            for call in self._awaiting
            if way in self._ways.get(call, ()) and self._calls[call].command.endswith(ran)
        ]
        return fitting[0] if len(fitting) == 1 else None


def _heard_now() -> int:
    return ticks_since_boot() - int(_HEARD_MARGIN_S * os.sysconf("SC_CLK_TCK"))


def _group_leaders_below(parent: int) -> list[Identity]:
    found = []
    for pid in pids():
        process = stat(pid)
        if process is not None and process.parent == parent and process.group == pid and process.state != "Z":
            found.append(Identity(pid, process.started))
    return found


"""The watcher of a proxy in front of a server it did not start (absent under `run`)."""


def described(orphan: Orphan) -> str:
    """An orphan as one log line says it."""
    where = f"pid {orphan.pid} ({orphan.command[:120]})"
    call = orphan.call
    if call is None:
        return f"{where}: no known tool call started it"
    state = "running at the crash" if call.running else "had completed"
    return f"{where}: {call.tool} call {call.call} of session {call.session_id}, {state}"
