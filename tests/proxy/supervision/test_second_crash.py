"""A crash followed at once by a second one, while the first crash's orphans are still being ended:
the restarted server's exit must reach the supervisor, on either event loop `run` may use.

The test process plays the dead server's parent (its children are what the supervisor adopted)
and the proxy's loop is busy for a moment when the second server dies, as a loaded proxy is.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from proxy.opencode.tracker import FollowedEvent
from proxy.supervision import supervisor, tool_processes
from proxy.supervision.server_command import ServerCommand, free_loopback_port
from proxy.supervision.supervisor import ChildState, Orphans, Restart, Supervisor
from proxy.supervision.tool_processes import ToolProcesses
from proxy.system.procfs import command_line
from tests.proxy.supervision.test_run import FAKE_SERVER

IGNORES_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
GRACE_S = 6.0
"""How long ending the first crash's orphan takes (it ignores SIGTERM): the second crash falls within."""


def loops() -> list[object]:
    found: list[object] = [pytest.param(asyncio.new_event_loop, id="asyncio")]
    with contextlib.suppress(ImportError):
        import uvloop  # noqa: PLC0415 - what `settle-proxy run` uses when installed

        found.append(pytest.param(uvloop.new_event_loop, id="uvloop"))
    return found


@pytest.fixture
def stubborn_tool() -> Iterator[subprocess.Popen[bytes]]:
    """A tool process as opencode's bash tool starts one (its own group), that ignores SIGTERM."""
    # A command line of its own: a tool left by an earlier test (adopted by this process when it is
    # a subreaper) must not be the one tied to the call.
    marked = f"{IGNORES_TERM}  # {uuid.uuid4().hex}"
    tool = subprocess.Popen([sys.executable, "-c", marked], process_group=0)
    yield tool
    with contextlib.suppress(ProcessLookupError):
        os.killpg(tool.pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        tool.wait()


async def this_process() -> int:
    return os.getpid()


async def until(condition: Callable[[], bool], what: str, within: float) -> None:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within:g} s waiting for {what}")
        await asyncio.sleep(0.02)


async def two_crashes(child: Supervisor, tool: subprocess.Popen[bytes]) -> None:
    running = asyncio.create_task(child.run())
    try:
        await until(lambda: child.state is ChildState.RUNNING, "the first server answering", 10)
        first = child.pid
        assert first is not None
        await tie(child.tool_processes, tool)
        os.kill(first, signal.SIGKILL)
        await until(lambda: child.restarts == 1 and child.pid is not None, "the restarted server", 5)
        second = child.pid
        assert second is not None
        assert child._ending is not None
        assert not child._ending.done()  # the first crash's orphan is still being ended
        os.kill(second, signal.SIGKILL)
        time.sleep(0.3)  # noqa: ASYNC251 - the proxy's loop is busy when the server dies
        await until(lambda: child.restarts == 2, "the second crash to be seen", GRACE_S - 1)
        assert child.last_exit == -signal.SIGKILL
        assert child.health()["last_exit"] == "killed by SIGKILL"
    finally:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(child.stop(), GRACE_S + 2)
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running


async def tie(watcher: ToolProcesses, tool: subprocess.Popen[bytes]) -> None:
    """The stream shows the tool's call start: the tool is tied to a call that runs."""
    part = {
        "id": "prt_1",
        "sessionID": "ses_a",
        "type": "tool",
        "tool": "bash",
        "state": {"status": "running", "input": {"command": command_line(tool.pid)}},
    }
    watcher.event(FollowedEvent("/d", None, "message.part.updated", {"sessionID": "ses_a", "part": part}))
    await until(lambda: watcher.orphans([tool.pid])[0].call_was_running, "the tool tied to its call", 5)
    await watcher.flush()


@pytest.mark.parametrize("new_loop", loops())
def test_a_second_crash_while_the_first_ones_orphans_are_ended_is_seen_with_its_status(
    monkeypatch: pytest.MonkeyPatch,
    stubborn_tool: subprocess.Popen[bytes],
    new_loop: Callable[[], asyncio.AbstractEventLoop],
) -> None:
    monkeypatch.setattr(supervisor, "BACKOFF_S", (0.05,))
    monkeypatch.setattr(supervisor, "STOP_GRACE_S", GRACE_S)
    monkeypatch.setattr(supervisor, "become_subreaper", lambda: True)  # the test's children are adopted
    monkeypatch.setattr(tool_processes, "_SCAN_AFTER_S", (0.05, 0.5, 2.0))  # looks again, as it does for real
    command = ServerCommand.parse([sys.executable, FAKE_SERVER])
    child = Supervisor(command, free_loopback_port(), Restart.ON_FAILURE, Orphans.TERMINATE)
    child.tool_processes = ToolProcesses(this_process)
    with asyncio.Runner(loop_factory=new_loop) as runner:
        runner.run(two_crashes(child, stubborn_tool))
