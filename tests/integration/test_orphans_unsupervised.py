"""A proxy in front of a server it did not start (the real opencode 1.18.33): it records the tool
processes the server starts, and after the server's own pid is SIGKILLed mid-tool and the server
restarted, it names the tools that outlived it (`/_settle/orphans`), as does `settle-proxy orphans`
from its state database, which with `--terminate` ends them."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from proxy.demo.model import MockModel

from .http_client import request
from .opencode_server import OpencodeServer, running_opencode
from .polling import poll
from .proctree import is_gone, kill_tree
from .proxy_process import ProxyProcess
from .turns import Observed, start_turn, wait_tool_running

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def server(mock_model: MockModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpencodeServer]:
    with running_opencode(tmp_path_factory.mktemp("unsupervised"), mock_model.base_url) as started:
        yield started


def recorded(database: Path) -> list[Any] | None:
    if not database.is_file():
        return None
    with sqlite3.connect(database) as connection:
        rows = connection.execute("SELECT pid, session, call FROM tool_process").fetchall()
    return rows or None


def test_tools_that_outlive_their_server_are_named_and_can_be_ended(
    server: OpencodeServer, tmp_path: Path
) -> None:
    proxy = ProxyProcess(server.url, tmp_path / "proxy.log")
    state = tmp_path / "proxy-state" / "settle-proxy" / "processes.db"
    left: set[int] = set()
    try:
        proxy.start()
        turn = start_turn("v1", proxy.url, server.project, "run the demo")
        observed = Observed(turn, wait_tool_running(proxy.url, turn))
        rows = poll(lambda: recorded(state), what="the tool process recorded", timeout=30)
        assert [(session, call) for _, session, call in rows] == [(observed.session_id, observed.tool_id)]

        left = server.kill_server_only()
        server.restart()

        def listed() -> list[dict[str, Any]] | None:
            found = request("GET", f"{proxy.url}/_settle/orphans", timeout=15).json()["orphans"]
            return found or None

        (orphan,) = poll(listed, what="the orphan named after the restart", timeout=60)
        assert (orphan["session"], orphan["part"], orphan["call_was_running"]) == (
            observed.session_id,
            observed.tool_id,
            True,
        )
        assert orphan["pid"] in left
        assert not is_gone(orphan["pid"])

        offline = subprocess.run(
            [sys.executable, "-m", "proxy", "orphans", "--state", str(state), "--terminate"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert offline.returncode == 10, offline.stderr
        assert observed.tool_id in offline.stdout
        poll(lambda: True if is_gone(orphan["pid"]) else None, what="the orphan ended", timeout=20)
    finally:
        proxy.stop()
        for pid in left:
            kill_tree(pid)
