"""A proxy restarted after it resumed a turn still counts that resume: the ledger is on disk.

`--resume-attempts 1`, the real opencode 1.18.33, the mock model asking for a tool on every prompt
(one that prints every second, so a proxy started during it sees it run): the server is SIGKILLed
mid-tool and the proxy resumes the turn; the proxy is then restarted (same state database) while
the resumed turn runs, and the server is SIGKILLed again. The restarted proxy saw the resumed turn
running, finds its interrupted message answering the prompt the first proxy recorded, and leaves
the session settled: one prompt for the person's turn, as the budget says.
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path

import pytest

from proxy.demo.model import MockModel, Plan

from .http_client import request
from .opencode_server import OpencodeServer
from .polling import poll
from .proxy_process import ProxyProcess
from .resumes import decided, following, requests_since
from .turns import Turn, find_running_tool, read_messages, start_turn, tools_of, wait_tool_running

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROMPT = "resume, restart the proxy, crash again"
TICKING = "for i in $(seq 600); do echo tick$i; sleep 1; done"
OPTIONS = (
    "--resume",
    "--resume-unsafe",  # TICKING is a `for` loop with a `$(...)`: unsafe, and resumed all the same here
    "--write-back",
    "api",
    "--grace",
    "0.5",
    "--resume-attempts",
    "1",
    "--log-format",
    "json",
)
TIMEOUT_S = 90.0


def running_again(server: OpencodeServer, turn: Turn) -> bool | None:
    """Whether the resumed turn runs a call of its own (the session holds two, one running)."""
    messages = read_messages(server.url, turn)
    calls = [tool for message in messages for tool in tools_of(message, "v1")[1]]
    return True if len(calls) == 2 and find_running_tool(messages, "v1") is not None else None


def test_a_restarted_proxy_spends_no_more_than_the_budget(
    opencode: OpencodeServer, mock_model: MockModel, tmp_path: Path
) -> None:
    mock_model.plan(PROMPT, Plan(command=TICKING, each_prompt=True))
    first = ProxyProcess(opencode.url, tmp_path / "first.log", OPTIONS)
    again = ProxyProcess(opencode.url, tmp_path / "again.log", OPTIONS)
    try:
        first.start()
        poll(partial(following, first), what="the proxy following the server", timeout=60)
        turn = start_turn("v1", opencode.url, opencode.project, PROMPT)
        wait_tool_running(opencode.url, turn)
        started = time.time()
        opencode.crash()
        opencode.restart()
        [resumed] = poll(partial(decided, first.url, turn), what="the first decision", timeout=TIMEOUT_S)
        assert resumed["outcome"] == "resumed", resumed
        poll(partial(running_again, opencode, turn), what="the resumed turn's own call", timeout=TIMEOUT_S)
        first.stop()
        again.start()
        poll(partial(following, again), what="the restarted proxy following", timeout=60)
        poll(partial(watching, again, turn), what="the restarted proxy seeing the turn run", timeout=30)
        opencode.crash()
        opencode.restart()
        [left] = poll(
            partial(decided, again.url, turn), what="the restarted proxy's decision", timeout=TIMEOUT_S
        )
    finally:
        first.stop()
        again.stop()
    assert left["outcome"] == "skipped", left
    assert left["why"] == "1 prompt(s) sent for this turn already (--resume-attempts 1)"
    assert len([r for r in requests_since(mock_model, turn, started) if r.latest_prompt != PROMPT]) == 1
    assert find_running_tool(read_messages(opencode.url, turn), "v1") is None


def watching(proxy: ProxyProcess, turn: Turn) -> bool | None:
    """Whether the proxy's stream shows it the session in a turn (the resumed turn's ticks)."""
    reply = request("GET", f"{proxy.url}/_settle/resume", timeout=15)
    return True if turn.session_id in reply.json()["running"] else None
