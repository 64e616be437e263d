"""`settle-proxy run --orphans terminate` with the real opencode 1.18.33: the server SIGKILLed
mid-tool, then its restarted self SIGKILLed at once, while the first crash's tool (one that
ignores SIGTERM) is still being ended. The second exit is seen with its status, the server is
started a third time, and the orphan is ended after the grace."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from proxy.demo.model import MockModel, Plan

from .http_client import request
from .opencode_server import OpencodeServer, running_opencode
from .polling import poll
from .proctree import descendants, is_gone
from .test_run_supervised import following, health, tied, written
from .turns import start_turn, wait_tool_running

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STUBBORN = "trap '' TERM; sleep 720"
"""A tool that outlives SIGTERM: ending it takes the whole grace (10 s), then SIGKILL."""


def server_state(server: OpencodeServer) -> dict[str, Any] | None:
    """The supervised server's state, from the proxy's health."""
    try:
        return dict(health(server)["server"])
    except TimeoutError:  # health asks the server, and one just started may not answer yet
        return None


def restarted(server: OpencodeServer, count: int) -> dict[str, Any] | None:
    """The server's state once it has been restarted `count` times and runs."""
    found = server_state(server)
    return found if found and found["restarts"] == count and found["pid"] is not None else None


def test_a_second_crash_at_once_is_seen_while_the_first_ones_orphan_is_ended(
    mock_model: MockModel, tmp_path: Path
) -> None:
    mock_model.plan("stubborn", Plan(command=STUBBORN))
    with running_opencode(tmp_path, mock_model.base_url, supervised=("--orphans", "terminate")) as server:
        poll(partial(following, server), what="the proxy following the server's events", timeout=60)
        turn = start_turn("v2", server.url, server.project, "stubborn")
        wait_tool_running(server.url, turn)
        records = server.state_home / "settle-proxy" / "processes.db"
        poll(partial(tied, records, 1), what="the tool tied to its call", timeout=30)
        first = health(server)["server"]["pid"]
        tools = descendants(first) - {first}
        assert tools

        os.kill(first, signal.SIGKILL)

        second = poll(partial(restarted, server, 1), what="the first restart", timeout=30, interval=0.05)[
            "pid"
        ]
        os.kill(second, signal.SIGKILL)
        assert not all(map(is_gone, tools)), "the first crash's tool is still being ended"
        log = server.log_path.read_text(errors="replace")
        assert "ending the process groups of 1 orphaned call(s)" in log

        third = poll(partial(restarted, server, 2), what="the second crash seen and restarted", timeout=60)
        assert third["last_exit"] == "killed by SIGKILL"
        assert third["pid"] not in (first, second)
        poll(lambda: True if all(map(is_gone, tools)) else None, what="the orphan ended", timeout=30)
        poll(partial(answering, server), what="the third server answering through the proxy", timeout=60)


def answering(server: OpencodeServer) -> bool | None:
    try:
        found = health(server)
    except TimeoutError:
        return None
    return True if found["upstream"]["reachable"] and found["server"]["restarts"] == 2 else None


def test_the_first_crashs_orphan_is_named_across_a_second_crash_and_terminate_ends_it(
    mock_model: MockModel, tmp_path: Path
) -> None:
    """Issue 47.7: the first crash's tool, its call written back (settled) in the next server's
    life, stays named as running at its crash after a second crash (it was labelled "completed"),
    and `settle-proxy orphans --terminate` ends it (it said "0 running call(s)" and left it)."""
    mock_model.plan("first", Plan(command="echo first && sleep 721"))
    mock_model.plan("second", Plan(command="echo second && sleep 722"))
    with running_opencode(tmp_path, mock_model.base_url, supervised=("--write-back", "api")) as server:
        poll(partial(following, server), what="the proxy following the server's events", timeout=60)
        records = server.state_home / "settle-proxy" / "processes.db"
        cut = []
        for count, prompt in enumerate(("first", "second"), start=1):
            turn = start_turn("v1", server.url, server.project, prompt)
            tool = wait_tool_running(server.url, turn)
            poll(partial(tied, records, count), what=f"the {prompt} tool tied to its call", timeout=30)
            pid = health(server)["server"]["pid"]
            cut.append((turn, str(tool.tool["id"]), descendants(pid) - {pid}))
            os.kill(pid, signal.SIGKILL)
            poll(partial(restarted, server, count), what=f"restart {count}", timeout=60)
            direct = health(server)["upstream"]["url"]
            poll(partial(written, direct, turn), what=f"the {prompt} call written back", timeout=60)
        (first, first_part, first_tools), (second, _, second_tools) = cut
        named = {(o["part"], o["pid"], o["call_was_running"]) for o in orphans(server)}
        alive = [pid for pid in first_tools if not is_gone(pid)]
        assert alive, "a SIGKILL of the server leaves its tools running"
        assert all((first_part, pid, True) in named for pid in alive), named
        offline = subprocess.run(
            [sys.executable, "-m", "proxy", "orphans", "--state", str(records), "--terminate"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert offline.returncode == 10, offline.stderr
        assert first.session_id in offline.stdout
        assert second.session_id in offline.stdout
        everything = first_tools | second_tools
        poll(lambda: True if all(map(is_gone, everything)) else None, what="both orphans ended", timeout=30)


def orphans(server: OpencodeServer) -> list[dict[str, Any]]:
    listed: list[dict[str, Any]] = request("GET", f"{server.url}/_settle/orphans", timeout=15).json()[
        "orphans"
    ]
    return listed
