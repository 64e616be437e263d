"""`settle-proxy run -- opencode serve --port P` with the real opencode 1.18.33: clients use P as
before; the server's own pid SIGKILLed mid-tool (as an OOM kill does) is restarted, its stale
tools are settled for every client, the tool's process it left running is adopted by the proxy,
`/_settle/orphans` names each with its session and part, and SIGTERM to the proxy leaves no
process behind."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from proxy.demo.model import MockModel, Plan
from proxy.system.procfs import command_line

from .http_client import request
from .opencode_server import OpencodeServer, opencode_binary, running_opencode
from .polling import poll
from .proctree import descendants, is_gone
from .test_tui import assert_settled, shows_running, shows_settled, watch
from .tui import Terminals
from .turns import (
    RUNTIMES,
    Observed,
    Turn,
    find_running_tool,
    read_messages,
    start_turn,
    tools_of,
    wait_tool_running,
    wait_turn_done,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def supervised(mock_model: MockModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpencodeServer]:
    with running_opencode(
        tmp_path_factory.mktemp("supervised"), mock_model.base_url, supervised=()
    ) as server:
        yield server


@pytest.fixture(scope="module")
def terminating(mock_model: MockModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpencodeServer]:
    root = tmp_path_factory.mktemp("terminating")
    options = ("--orphans", "terminate", "--write-back", "api")
    with running_opencode(root, mock_model.base_url, supervised=options) as server:
        yield server


def following(server: OpencodeServer) -> bool | None:
    """Whether the proxy follows the server's event stream, from which it learns of tool calls."""
    try:
        # Before the server first answers, the details are not shown (their body has no liveness).
        return True if health(server).get("liveness", {}).get("source") == "events" else None
    except TimeoutError:
        return None


def health(server: OpencodeServer) -> dict[str, Any]:
    """The proxy's health, also while the server is down (503)."""
    return dict(request("GET", f"{server.url}/_settle/health", timeout=15).json())


def settled(server: OpencodeServer, observed: Observed) -> bool | None:
    messages = read_messages(server.url, observed.turn)
    if find_running_tool(messages, observed.runtime) is not None:
        return None
    return True


def test_crash_restart_settle_and_a_clean_stop(supervised: OpencodeServer) -> None:
    proxy = supervised.pid
    poll(partial(following, supervised), what="the proxy following the server's events", timeout=60)
    turns = [start_turn(runtime, supervised.url, supervised.project, "run the demo") for runtime in RUNTIMES]
    observed = [Observed(turn, wait_tool_running(supervised.url, turn)) for turn in turns]
    # A process is tied to its call by a look moments after the call starts (README); a crash
    # before that look leaves it untied, only reported, so the crash waits for the ties.
    records = supervised.state_home / "settle-proxy" / "processes.db"
    poll(partial(tied, records, len(observed)), what="the running tools tied to their calls", timeout=30)
    server = health(supervised)["server"]["pid"]
    tools = descendants(server) - {server}
    assert tools, "the tools run below the server"

    os.kill(server, signal.SIGKILL)  # the server's own pid only, as the OOM killer does

    def restarted() -> dict[str, Any] | None:
        try:
            found = health(supervised)
        except TimeoutError:  # health asks the server, and a server just started may not answer yet
            return None
        return found if found["server"]["restarts"] == 1 and found["upstream"]["reachable"] else None

    after = poll(restarted, what="the server restarted", timeout=90)
    assert after["server"]["last_exit"] == "killed by SIGKILL"
    assert after["server"]["pid"] != server
    for each in observed:
        poll(partial(settled, supervised, each), what=f"{each.runtime} tool settled", timeout=60)
    left = [pid for pid in tools if not is_gone(pid)]
    assert left, "a SIGKILL of the server leaves its tools running"
    assert set(left) <= descendants(proxy)  # adopted by the proxy, not by PID 1
    listed = request("GET", f"{supervised.url}/_settle/orphans", timeout=15).json()["orphans"]
    assert {(o["session"], o["part"], o["tool"], o["call_was_running"]) for o in listed} == {
        (each.session_id, each.tool_id, "bash", True) for each in observed
    }
    assert {o["pid"] for o in listed} <= set(left)

    os.kill(proxy, signal.SIGTERM)
    poll(lambda: True if is_gone(proxy) else None, what="the proxy to stop", timeout=40)
    everything = [*left, after["server"]["pid"]]
    assert [pid for pid in everything if not is_gone(pid)] == []


def test_terminate_ends_only_the_calls_that_were_running(
    terminating: OpencodeServer, mock_model: MockModel
) -> None:
    """A dev server a completed call left on purpose, and an unrelated process with the same command
    line as the running tool, survive; the running calls' processes are ended within the grace; and
    with `--write-back api` both runtimes' calls are written into the restarted server before any
    client fetches them (its own view, read directly, shows them settled)."""
    poll(partial(following, terminating), what="the proxy following the server's events", timeout=60)
    mock_model.plan("start it in the background", Plan(command="(sleep 710 >/dev/null 2>&1 &); echo started"))
    background_turn = start_turn("v1", terminating.url, terminating.project, "start it in the background")
    wait_turn_done(terminating.url, background_turn)
    background = poll(partial(running_below, terminating.pid, "sleep 710"), what="the dev server", timeout=30)
    unrelated = subprocess.Popen(["sleep", "600"], stdin=subprocess.DEVNULL)
    try:
        turns = [
            start_turn(runtime, terminating.url, terminating.project, "run the demo") for runtime in RUNTIMES
        ]
        for turn in turns:
            wait_tool_running(terminating.url, turn)
        records = terminating.state_home / "settle-proxy" / "processes.db"
        poll(partial(tied, records, 2), what="the running tools tied to their calls", timeout=30)
        server = health(terminating)["server"]["pid"]
        tools = descendants(server) - {server} - set(background)
        os.kill(server, signal.SIGKILL)
        poll(
            lambda: True if all(map(is_gone, tools)) else None,
            what="the running calls' processes ended",
            timeout=30,
        )
        assert not any(map(is_gone, background))
        assert unrelated.poll() is None
        direct = health(terminating)["upstream"]["url"]
        for turn in turns:
            poll(partial(written, direct, turn), what=f"{turn.runtime} call written directly", timeout=60)
    finally:
        unrelated.kill()
        unrelated.wait()
        for pid in background:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def tied(records: Path, count: int) -> bool | None:
    """Whether the state database holds `count` tool processes tied to their calls."""
    if not records.is_file():
        return None
    with sqlite3.connect(records) as connection:
        (found,) = connection.execute("SELECT count(*) FROM tool_process").fetchone()
    return True if found >= count else None


def written(direct: str, turn: Turn) -> bool | None:
    """Whether the server's own view (no proxy in between) shows the turn's call settled."""
    try:
        messages = read_messages(direct, turn)
    except OSError:  # not restarted yet
        return None
    tools = [item for message in messages for item in tools_of(message, turn.runtime)[1]]
    return True if tools and all(tool["state"]["status"] == "error" for tool in tools) else None


def running_below(root: int, command: str) -> list[int] | None:
    """The processes below `root` whose command line is `command` (None while there are none)."""
    found = [pid for pid in descendants(root) if command_line(pid) == command and not is_gone(pid)]
    return found or None


def test_a_tui_open_across_the_crash_goes_quiet(terminating: OpencodeServer, tmp_path: Path) -> None:
    """The TUI never re-fetches after its stream reconnects: under `run` too, only what the proxy
    tells its stream (and the server's own write-back events) can end its spinner and busy bar."""
    poll(partial(following, terminating), what="the proxy following the server's events", timeout=60)
    turn = start_turn("v1", terminating.url, terminating.project, "tui under run")
    with Terminals(tmp_path, opencode_binary()) as terminals:
        tui = terminals.attach("across_crash", terminating.url, turn.session_id, turn.directory)
        wait_tool_running(terminating.url, turn)
        tui.wait_screen(shows_running, what="the TUI to show the live tool running", timeout=60)
        os.kill(health(terminating)["server"]["pid"], signal.SIGKILL)
        seen = watch({tui: shows_settled})["across_crash"]
    assert_settled(seen, "open through settle-proxy run across the crash")
