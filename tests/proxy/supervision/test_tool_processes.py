"""Tying the server's tool processes to their calls, by pid and start time (here the test process
plays the server: the processes it starts are its children)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from proxy.opencode.tracker import FollowedEvent
from proxy.supervision import tool_processes
from proxy.supervision.tool_processes import ToolProcesses
from proxy.system.process_groups import Member
from proxy.system.procfs import stat, ticks_since_boot


class Tools(list[subprocess.Popen[bytes]]):
    """Processes started as opencode's bash tool starts them: each the leader of its own group."""

    def start(self, *argv: str) -> None:
        self.append(subprocess.Popen(argv, process_group=0))


@pytest.fixture
def tools() -> Iterator[Tools]:
    started = Tools()
    yield started
    for process in started:
        os.killpg(process.pid, signal.SIGKILL)  # a shell's command runs on in its group
        process.wait()


async def this_process() -> int:
    """The test plays the server: the processes it starts are the server's children."""
    return os.getpid()


@pytest.fixture
def watcher(monkeypatch: pytest.MonkeyPatch) -> ToolProcesses:
    """A tracker of this process's children that looks for them soon after a call starts."""
    monkeypatch.setattr(tool_processes, "_SCAN_AFTER_S", (0.1,))
    return ToolProcesses(this_process)


def v1_part(part_id: str, status: str, command: str) -> FollowedEvent:
    part: dict[str, Any] = {
        "id": part_id,
        "sessionID": "ses_a",
        "type": "tool",
        "tool": "bash",
        "state": {"status": status, "input": {"command": command}},
    }
    return FollowedEvent("/d", None, "message.part.updated", {"sessionID": "ses_a", "part": part})


def v2_called(call: str, command: str) -> FollowedEvent:
    properties = {"sessionID": "ses_b", "callID": call, "tool": "bash", "input": {"command": command}}
    return FollowedEvent("/d", None, "session.next.tool.called", properties)


async def test_each_process_is_tied_to_the_call_whose_command_it_runs(
    tools: Tools, watcher: ToolProcesses
) -> None:
    watcher.event(v1_part("prt_1", "running", "echo hello && sleep 601"))
    watcher.event(v2_called("call_2", "sleep 602"))
    tools.start("sleep", "601")
    tools.start("/bin/sh", "-c", "sleep 602")
    tools.start("sleep", "603")  # no call runs this
    await watcher.flush()  # its look for the processes (soon after each call started)
    watcher.event(v1_part("prt_1", "completed", "echo hello && sleep 601"))
    progress = {"sessionID": "ses_b", "callID": "call_2", "structured": {}}
    watcher.event(FollowedEvent("/d", None, "session.next.tool.progress", progress))  # still running
    found = {orphan.pid: orphan.as_json() for orphan in watcher.orphans([tool.pid for tool in tools])}
    first, second, unknown = (found[tool.pid] for tool in tools)
    assert (first["part"], first["session"], first["call_was_running"]) == ("prt_1", "ses_a", False)
    assert (second["part"], second["session"], second["call_was_running"]) == ("call_2", "ses_b", True)
    assert (unknown["part"], unknown["call_was_running"]) == (None, False)


async def test_a_process_found_orphaned_stays_named_as_running_when_its_call_ends_later(
    tools: Tools, watcher: ToolProcesses
) -> None:
    """A crash left it with its call running; the restarted server then shows the call ended (its
    settlement): the process was left by the crash all the same, and may still be ended for it."""
    watcher.event(v1_part("prt_1", "running", "sleep 630"))
    tools.start("sleep", "630")
    await watcher.flush()  # its look for the process (soon after the call started)
    (at_the_crash,) = watcher.orphans([tools[0].pid])
    assert at_the_crash.call_was_running
    watcher.event(v1_part("prt_1", "error", "sleep 630"))  # settled in the next server's life
    (after,) = watcher.orphans([tools[0].pid])
    assert (after.call_was_running, after.as_json()["part"]) == (True, "prt_1")


async def test_a_process_two_calls_could_run_is_tied_to_neither(tools: Tools, watcher: ToolProcesses) -> None:
    watcher.event(v1_part("prt_1", "running", "sleep 604"))
    watcher.event(v1_part("prt_2", "running", "true && sleep 604"))
    tools.start("sleep", "604")
    await watcher.flush()  # its look for the processes (soon after each call started)
    (orphan,) = watcher.orphans([tools[0].pid])
    assert orphan.call is None


async def test_a_call_forgotten_for_newer_ones_waits_for_no_process(
    tools: Tools, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tool_processes, "_SCAN_AFTER_S", (0.1,))
    monkeypatch.setattr(tool_processes, "_REMEMBERED", 2)
    watcher = ToolProcesses(this_process)
    for number in range(3):
        watcher.event(v1_part(f"prt_{number}", "running", f"sleep 62{number}"))
    tools.start("sleep", "620")  # the command of the call forgotten for the later two
    tools.start("sleep", "622")
    await watcher.flush()  # its look for the processes (soon after each call started)
    forgotten, newest = watcher.orphans([tool.pid for tool in tools])
    assert (forgotten.as_json()["part"], newest.as_json()["part"]) == (None, "prt_2")


async def test_a_tool_that_ended_unreaped_is_never_the_process_of_a_new_call(
    tools: Tools, watcher: ToolProcesses
) -> None:
    tools.start("true")  # an earlier call's process: ended, not yet reaped by the server
    await until_ended(tools[0].pid)
    watcher.event(v1_part("prt_1", "running", "sleep 606"))
    tools.start("sleep", "606")
    await watcher.flush()  # its look for the processes (soon after the call started)
    ended, running = watcher.orphans([tool.pid for tool in tools])
    assert (ended.call, running.call_was_running) == (None, True)


async def until_ended(pid: int) -> None:
    for _ in range(500):
        if (found := stat(pid)) is not None and found.state == "Z":
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"process {pid} never ended")


async def test_a_recycled_pid_is_not_the_process_that_was_recorded(
    tools: Tools, watcher: ToolProcesses, monkeypatch: pytest.MonkeyPatch
) -> None:
    watcher.event(v1_part("prt_1", "running", "sleep 605"))
    tools.start("sleep", "605")
    await watcher.flush()  # its look for the processes (soon after each call started)
    (recorded,) = list(watcher._processes)
    monkeypatch.setattr(
        tool_processes.Identity, "of", classmethod(lambda cls, pid: cls(pid, recorded.started + 1))
    )
    (orphan,) = watcher.orphans([tools[0].pid])
    assert orphan.call is None


async def test_the_same_command_in_both_runtimes_is_told_apart_by_how_it_runs(
    tools: Tools, watcher: ToolProcesses
) -> None:
    watcher.event(v1_part("prt_1", "running", "echo hello && sleep 606"))
    watcher.event(v2_called("call_2", "echo hello && sleep 606"))
    tools.start("sleep", "606")
    tools.start("/bin/sh", "-c", "echo hello && sleep 606")
    await watcher.flush()  # its look for the processes (soon after each call started)
    found = {orphan.pid: orphan.as_json()["part"] for orphan in watcher.orphans([tool.pid for tool in tools])}
    assert [found[tool.pid] for tool in tools] == ["prt_1", "call_2"]


def api_event(kind: str, call: str, key: str = "id", **data: Any) -> FollowedEvent:
    """A 2.x event of `/api/event` about `call`, keyed `id` (newer) or `callID` (older:
    `packages/schema/src/session-event.ts` `Tool.*` @03130971e20a)."""
    properties = {"sessionID": "ses_c", "assistantMessageID": "msg_c", key: call, **data}
    return FollowedEvent("/d", None, kind, properties, line_2x=True)


def api_called(call: str, command: str, key: str = "id") -> list[FollowedEvent]:
    """How 2.x starts a `shell` call: its input begins (naming the tool), then it is called
    (`Tool.Called`: the whole input, no tool name)."""
    return [
        api_event("session.tool.input.started", call, key, name="shell"),
        api_event("session.tool.called", call, key, input={"command": command}, executed=False),
    ]


async def test_2x_calls_are_tied_whether_the_shell_runs_the_command_or_becomes_it(
    tools: Tools, watcher: ToolProcesses
) -> None:
    for event in [
        *api_called("call_1", "echo hi && sleep 607"),
        *api_called("call_2", "sleep 608", "callID"),
    ]:
        watcher.event(event)
    tools.start("/usr/bin/bash", "-c", "echo hi && sleep 607")  # a list: bash runs it itself
    tools.start("sleep", "608")  # a single command: bash and dash exec it, and it leads the group
    await watcher.flush()  # its look for the processes (soon after each call started)
    watcher.event(api_event("session.tool.success", "call_2", "callID", executed=True))
    found = {orphan.pid: orphan.as_json() for orphan in watcher.orphans([tool.pid for tool in tools])}
    first, second = (found[tool.pid] for tool in tools)
    assert (first["part"], first["session"], first["tool"], first["call_was_running"]) == (
        "call_1",
        "ses_c",
        "shell",
        True,
    )
    assert (second["part"], second["call_was_running"]) == ("call_2", False)


async def test_a_2x_call_without_a_command_waits_for_no_process(tools: Tools, watcher: ToolProcesses) -> None:
    watcher.event(
        api_event("session.tool.called", "call_3", input={"filePath": "/etc/hosts"}, executed=False)
    )
    tools.start("sleep", "609")
    await watcher.flush()
    (orphan,) = watcher.orphans([tools[0].pid])
    assert orphan.call is None


class _Recorded:
    """A recorder whose every recorded process outlived its server."""

    def __init__(self, pids: list[int]) -> None:
        self._pids = pids

    async def record(self, *_: Any) -> None: ...

    async def ended(self, call: str) -> None: ...

    async def left_running(self) -> list[Any]:
        return [
            SimpleNamespace(process=SimpleNamespace(pid=pid), command="sleep", call=None)
            for pid in self._pids
        ]


async def test_processes_reported_once_are_remembered_up_to_a_bound(
    tools: Tools, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tool_processes, "_REMEMBERED", 2)
    for number in range(3):
        tools.start("sleep", f"61{number}")
    watcher = ToolProcesses(this_process, reports=True)
    watcher.recorder = _Recorded([tool.pid for tool in tools])
    watcher.following()
    await watcher.flush()
    assert len(watcher._reported) == 2


def gone_leader(monkeypatch: pytest.MonkeyPatch, group: int, *commands: str) -> None:
    """A group whose leader exited before any look, its members started now (faked /proc)."""
    now = ticks_since_boot()
    found = [Member(group + 1 + n, command, now, 1) for n, command in enumerate(commands)]
    monkeypatch.setattr(tool_processes, "leaderless", lambda parents, since: {group: found})


async def test_a_group_whose_leader_exited_at_once_is_tied_to_the_one_call_it_fits(
    watcher: ToolProcesses, monkeypatch: pytest.MonkeyPatch
) -> None:
    gone_leader(monkeypatch, 70_000, "sleep 90")
    watcher.event(v1_part("prt_1", "running", "sleep 90 & echo started"))
    await watcher.flush()
    assert [(call.call, group.leader, group.leader_seen) for call, group in watcher.open_groups()] == [
        ("prt_1", 70_000, False)
    ]


async def test_a_call_that_waits_for_a_person_is_no_candidate_until_answered(
    watcher: ToolProcesses, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two calls of the same command: the one whose session waits for a permission started no
    process, so the group is the other's; once answered, it is awaited again."""
    watcher.event(v1_part("prt_1", "running", "sleep 90 & echo started"))
    asked = {"sessionID": "ses_a", "id": "per_1"}
    watcher.event(FollowedEvent("/d", None, "permission.asked", asked))
    await watcher.flush()
    gone_leader(monkeypatch, 70_000, "sleep 90")
    watcher.event(v2_called("call_2", "sleep 90 & echo started"))
    await watcher.flush()
    assert [call.call for call, _ in watcher.open_groups()] == ["call_2"]
    gone_leader(monkeypatch, 71_000, "sleep 90")
    watcher.event(FollowedEvent("/d", None, "permission.replied", asked))
    await watcher.flush()
    assert sorted(call.call for call, _ in watcher.open_groups()) == ["call_2", "prt_1"]


async def test_a_group_two_calls_fit_is_tied_to_neither(
    watcher: ToolProcesses, monkeypatch: pytest.MonkeyPatch
) -> None:
    watcher.event(v1_part("prt_1", "running", "sleep 90 & echo one"))
    watcher.event(v2_called("call_2", "sleep 90 & echo two"))
    gone_leader(monkeypatch, 70_000, "sleep 90")
    await watcher.flush()
    assert watcher.open_groups() == []
