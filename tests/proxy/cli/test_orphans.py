"""`settle-proxy orphans`, as users run it, over a state database like the one `run` keeps."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.supervision.process_records import ProcessRecords
from proxy.supervision.tool_processes import Identity, ToolCall
from tests.proxy.conftest import settle_proxy


class Processes(list[subprocess.Popen[bytes]]):
    def start(self, *argv: str) -> subprocess.Popen[bytes]:
        self.append(subprocess.Popen(argv, process_group=0))
        return self[-1]


@pytest.fixture
def processes() -> Iterator[Processes]:
    started = Processes()
    yield started
    for process in started:
        process.kill()
        process.wait()


def identity(process: subprocess.Popen[bytes]) -> Identity:
    found = Identity.of(process.pid)
    assert found is not None
    return found


async def record(path: Path, server: Identity, *tools: tuple[subprocess.Popen[bytes], str, bool]) -> None:
    async with ProcessRecords.open(path) as records:
        for process, call, running in tools:
            await records.record(
                identity(process), f"sleep {call}", server, ToolCall("ses_x", call, "bash", "sleep", running)
            )


def test_lists_and_ends_what_a_dead_server_left(tmp_path: Path, processes: Processes) -> None:
    state = tmp_path / "processes.db"
    server = processes.start("sleep", "900")
    running, completed = processes.start("sleep", "901"), processes.start("sleep", "902")
    gone = processes.start("sleep", "903")
    asyncio.run(
        record(
            state,
            identity(server),
            (running, "prt_run", True),
            (completed, "prt_done", False),
            (gone, "prt_gone", True),
        )
    )
    gone.kill()
    gone.wait()

    alive_server = settle_proxy("orphans", "--state", str(state))
    assert (alive_server.returncode, alive_server.stdout.strip()) == (0, "no orphaned tool processes")

    server.kill()
    server.wait()
    listed = settle_proxy("orphans", "--state", str(state))
    assert listed.returncode == 10, listed.stderr
    assert "prt_run" in listed.stdout
    assert "prt_done" in listed.stdout
    assert "prt_gone" not in listed.stdout

    ended = settle_proxy("orphans", "--state", str(state), "--terminate")
    assert ended.returncode == 10, ended.stderr
    assert running.wait(timeout=15) is not None
    assert completed.poll() is None  # a completed call's process is never ended


def test_nothing_recorded(tmp_path: Path) -> None:
    result = settle_proxy("orphans", "--state", str(tmp_path / "none.db"))
    assert (result.returncode, result.stdout.strip()) == (0, f"nothing recorded at {tmp_path / 'none.db'}")


def test_ctrl_c_while_groups_end_is_one_line(tmp_path: Path, processes: Processes) -> None:
    """A call's process that ignores SIGTERM keeps `--terminate` waiting for its grace: Ctrl-C then
    is one line and exit 130, never a traceback."""
    state = tmp_path / "processes.db"
    server = processes.start("sleep", "900")
    stubborn = processes.start("sh", "-c", "trap '' TERM; while :; do sleep 0.1; done")
    asyncio.run(record(state, identity(server), (stubborn, "prt_stubborn", True)))
    server.kill()
    server.wait()
    argv = [sys.executable, "-m", "proxy", "orphans", "--state", str(state), "--terminate"]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as orphans:
        assert orphans.stdout is not None
        while "ending the process groups" not in (line := orphans.stdout.readline()):
            assert line, "orphans ended before it said it was ending the groups"
        orphans.send_signal(signal.SIGINT)
        _, stderr = orphans.communicate(timeout=30)
    assert orphans.returncode == 130
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines() == [
        "settle-proxy orphans: interrupted: the groups were sent SIGTERM, none SIGKILL; "
        "run it again to see what still runs"
    ]
    assert stubborn.poll() is None  # it ignores SIGTERM, and got no SIGKILL


def test_a_process_left_by_an_earlier_crash_stays_named_as_running_and_is_ended(
    tmp_path: Path, processes: Processes
) -> None:
    """Two crashes: the first one's tool runs on, its call ends in the second server's life (it is
    settled there), then that server dies too. The tool is still named as running at its crash,
    and `--terminate` ends it; a call that ends while its own server lives is completed."""
    state = tmp_path / "processes.db"
    first_server, second_server = processes.start("sleep", "910"), processes.start("sleep", "911")
    left, done = processes.start("sleep", "912"), processes.start("sleep", "913")
    asyncio.run(record(state, identity(first_server), (left, "prt_left", True)))
    asyncio.run(record(state, identity(second_server), (done, "prt_done", True)))
    first_server.kill()
    first_server.wait()

    async def both_calls_end() -> None:
        async with ProcessRecords.open(state) as records:
            await records.ended("prt_left")
            await records.ended("prt_done")

    asyncio.run(both_calls_end())
    second_server.kill()
    second_server.wait()
    listed = settle_proxy("orphans", "--state", str(state))
    (left_row,) = [line for line in listed.stdout.splitlines() if "prt_left" in line]
    (done_row,) = [line for line in listed.stdout.splitlines() if "prt_done" in line]
    assert (left_row.split("│")[-2].strip(), done_row.split("│")[-2].strip()) == ("running", "completed")

    ended = settle_proxy("orphans", "--state", str(state), "--terminate")
    assert ended.returncode == 10, ended.stderr
    assert "ending the process groups of 1 running call(s)" in ended.stdout
    assert left.wait(timeout=15) is not None
    assert done.poll() is None
