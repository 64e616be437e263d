"""The stalled-call rule, on faked process readings: named only once the call's own process has
exited while another holds its output, for long enough; never while its own process lives, nor
while its session waits for a person; said once as it begins and once as it ends; ended once
through the server's abort when asked, and shown without any command line's arguments."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from proxy.opencode.tracker import FollowedEvent
from proxy.supervision.stalls import V1, Stalls
from proxy.supervision.tool_processes import Group, ToolCall
from proxy.system.process_groups import Member

SECRET = "--token=hunter2"
HOLDER = Member(41, f"sleep 90 {SECRET}", 100, 1)


class Calls:
    def __init__(self) -> None:
        self.call = ToolCall("ses_a", "prt_1", "bash", "sleep 90 & echo started")
        self.group = Group(40, None)

    def open_groups(self) -> list[tuple[ToolCall, Group]]:
        return [(self.call, self.group)] if self.call.running else []

    async def server(self) -> int | None:
        return 7


class Table:
    def __init__(self) -> None:
        self.leader_alive = False
        self.held: list[Member] = [HOLDER]

    def alive(self, pid: int, started: int | None) -> bool:
        return self.leader_alive

    def holders(self, group: Group, server: int | None) -> list[Member]:
        assert server == 7
        return list(self.held)


class Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


def opened() -> FollowedEvent:
    part: dict[str, Any] = {"id": "prt_1", "messageID": "msg_1", "sessionID": "ses_a", "type": "tool"}
    part["tool"] = "bash"
    part["state"] = {"status": "running", "input": {"command": "sleep 90 & echo started"}}
    return FollowedEvent("/project", None, "message.part.updated", {"sessionID": "ses_a", "part": part})


def person(verb: str) -> FollowedEvent:
    return FollowedEvent("/project", None, f"permission.{verb}", {"sessionID": "ses_a", "id": "per_1"})


class Aborts(list[tuple[str, str, str | None]]):
    fails = False

    async def __call__(self, session: str, line: str, directory: str | None) -> None:
        self.append((session, line, directory))
        if self.fails:
            raise RuntimeError("refused")


def watcher(table: Table, clock: Clock, aborts: Aborts | None = None) -> tuple[Stalls, Calls]:
    calls = Calls()
    stalls = Stalls(calls, after=10, abort=aborts, table=table, clock=clock)
    stalls.event(opened())
    return stalls, calls


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == "proxy.supervision.stalls"]


async def test_named_once_it_has_lasted_and_said_once_as_it_ends(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    table, clock = Table(), Clock()
    stalls, calls = watcher(table, clock)
    await stalls.check()
    clock.now += 9.9
    await stalls.check()
    assert stalls.stalled == []
    clock.now += 0.1
    await stalls.check()
    await stalls.check()
    shown: dict[str, Any] = stalls.stalled[0].as_json()
    assert shown == {
        "session": "ses_a",
        "message": "msg_1",
        "call": "prt_1",
        "tool": "bash",
        "since": 1_000_000,
        "holders": [{"pid": 41, "program": "sleep"}],
        "aborted": False,
    }
    calls.call.running = False
    await stalls.check()
    assert stalls.stalled == []
    said = messages(caplog)
    assert [line.split(":")[0] for line in said] == [
        "stalled call",
        "call prt_1 of session ses_a is no longer stalled",
    ]
    assert all(SECRET not in line for line in said)
    assert [r.levelname for r in caplog.records if r.name == "proxy.supervision.stalls"] == [
        "WARNING",
        "INFO",
    ]


@pytest.mark.parametrize("how", ["its own process lives", "nothing holds it", "a person is asked"])
async def test_never_named(how: str) -> None:
    table, clock = Table(), Clock()
    stalls, _ = watcher(table, clock)
    if how == "its own process lives":
        table.leader_alive = True
    elif how == "nothing holds it":
        table.held = []
    else:
        stalls.event(person("asked"))
    for _ in range(3):
        await stalls.check()
        clock.now += 3600
    assert stalls.stalled == []


async def test_judged_again_once_the_person_answers() -> None:
    table, clock = Table(), Clock()
    stalls, _ = watcher(table, clock)
    stalls.event(person("asked"))
    await stalls.check()
    stalls.event(person("replied"))
    await stalls.check()
    clock.now += 10
    await stalls.check()
    assert [stall.call.call for stall in stalls.stalled] == ["prt_1"]


async def test_a_call_heard_before_the_stream_came_back_is_not_judged() -> None:
    """After a crash the old server's calls are not running in the new one: none is named."""
    table, clock = Table(), Clock()
    stalls, _ = watcher(table, clock)
    stalls.following()
    await stalls.check()
    clock.now += 10
    await stalls.check()
    assert stalls.stalled == []


@pytest.mark.parametrize("fails", [False, True])
async def test_aborted_once_through_the_server(fails: bool, caplog: pytest.LogCaptureFixture) -> None:
    table, clock, aborts = Table(), Clock(), Aborts()
    aborts.fails = fails
    stalls, _ = watcher(table, clock, aborts)
    await stalls.check()
    clock.now += 10
    for _ in range(3):
        await stalls.check()
        clock.now += 10
    assert aborts == [("ses_a", V1, "/project")]
    assert stalls.stalled[0].aborted
    said = messages(caplog)
    ending = "failed: refused" if fails else "ended through the server's abort of session ses_a"
    assert sum(ending in line for line in said) == 1
