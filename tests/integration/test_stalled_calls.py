"""Stalled calls on the real opencode 1.18.33 under `settle-proxy run --stall-abort --resume`: a
bash call `sleep 90 & echo started`, whose shell exits at once while the background `sleep`
holds its output, is named stalled (its holder by pid and program) and ended through the
server's own abort, which ends the holder too; a call whose own `sleep` runs, and a call that
waits for a person's permission, are never named; and after a crash the aborted turn is not
continued, while the turn that was running is decided on."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.demo.model import MockModel, Plan

from .http_client import request
from .opencode_config import project_config
from .opencode_server import OpencodeServer, running_opencode
from .polling import poll
from .proctree import is_gone
from .resumes import decided
from .test_run_supervised import following, health
from .turns import Turn, find_running_tool, read_messages, start_turn, wait_tool_running

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STALLS = "sleep 90 & echo started"
OPTIONS = ("--stall-after", "2", "--stall-abort", "--resume", "--write-back", "api", "--log-format", "json")


@pytest.fixture(scope="module")
def server(mock_model: MockModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpencodeServer]:
    with running_opencode(
        tmp_path_factory.mktemp("stalls"), mock_model.base_url, supervised=OPTIONS
    ) as found:
        yield found


def logged(server: OpencodeServer, words: str) -> list[dict[str, Any]] | None:
    """The proxy's JSON log lines whose event holds `words` (their fields beside it), once there is one."""
    found = []
    for line in server.log_path.read_text(errors="replace").splitlines():
        if words in line and line.startswith("{"):
            record = json.loads(line)
            if words in record.get("event", ""):
                found.append(record)
    return found or None


def permission_asked(server: OpencodeServer, directory: Path) -> bool | None:
    asked = request("GET", f"{server.url}/permission?directory={directory}", timeout=15).json()
    return True if asked else None


def sleep_below(proxy: int) -> int | None:
    """The `sleep 90` a stalled call left, adopted by the proxy once its shell exited."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                command = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if parent == proxy and command == b"sleep\x0090\x00":
                return int(entry.name)
    return None


def settled_by_abort(server: OpencodeServer, turn: Turn) -> dict[str, Any] | None:
    """The assistant message the abort closed, once no call of the turn runs."""
    messages = read_messages(server.url, turn)
    if find_running_tool(messages, "v1") is not None:
        return None
    last = messages[-1]["info"]
    return last if last.get("error", {}).get("name") == "MessageAbortedError" else None


def test_a_stalled_call_is_named_and_aborted_the_others_never(
    server: OpencodeServer, mock_model: MockModel
) -> None:
    poll(partial(following, server), what="the proxy following the server's events", timeout=60)
    asks = server.add_project("asks")
    (asks / "opencode.json").write_bytes(
        orjson.dumps(project_config(mock_model.base_url) | {"permission": {"bash": "ask"}})
    )
    mock_model.plan("ask first", Plan(command=STALLS))
    mock_model.plan("stall me", Plan(command=STALLS))
    asking = start_turn("v1", server.url, asks, "ask first")
    poll(partial(permission_asked, server, asks), what="the permission asked", timeout=60)
    live = start_turn("v1", server.url, server.project, "run the demo")
    wait_tool_running(server.url, live)
    stalled = start_turn("v1", server.url, server.project, "stall me")

    # Seen before it can be named (--stall-after 2), so before the abort ends it.
    holder = poll(partial(sleep_below, server.pid), what="the holder adopted by the proxy", timeout=60)
    named = poll(partial(logged, server, "stalled call:"), what="the stalled call named", timeout=60)
    fields = named[0]
    assert [each["session"] for each in named] == [stalled.session_id]
    assert fields["tool"] == "bash"
    assert fields["holders"] == [{"pid": holder, "program": "sleep"}]
    assert fields["message"].startswith("msg_")
    assert fields["call"].startswith("prt_")
    poll(partial(logged, server, "ended through the server's abort"), what="the abort said", timeout=30)
    poll(partial(settled_by_abort, server, stalled), what="the turn ended by the abort", timeout=30)
    poll(lambda: True if is_gone(holder) else None, what="the holder ended with its call", timeout=30)
    poll(partial(logged, server, "is no longer stalled"), what="the stall's end said", timeout=30)
    metrics = request("GET", f"{server.url}/_settle/metrics", timeout=15).body.decode()
    assert 'settle_proxy_stall_aborts_total{outcome="sent"} 1.0' in metrics
    assert "settle_proxy_stalled_calls 0.0" in metrics
    assert health(server)["stalled"] == []
    assert find_running_tool(read_messages(server.url, live), "v1") is not None  # still runs, unnamed

    crashed_at = time.time()
    os.kill(health(server)["server"]["pid"], signal.SIGKILL)
    # The turn that was running at the crash is decided on; the one the abort ended is not a
    # crash's, so it has no decision at all, and the model is never asked to continue it.
    poll(partial(decided, server.url, live), what="the running turn decided on", timeout=120)
    poll(partial(decided, server.url, asking), what="the asking turn decided on", timeout=60)
    assert decided(server.url, stalled) is None
    assert [r for r in mock_model.requests() if r.at >= crashed_at and r.prompt == "stall me"] == []
    assert len(logged(server, "stalled call:") or []) == 1
