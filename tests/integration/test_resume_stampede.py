"""Never a stampede, with the real opencode 1.18.33 and the mock model: ten v1 turns cut by one
SIGKILL mid-call, behind one `--resume --write-back api` proxy (`--resume-concurrency 2
--resume-spacing 2`, the defaults). All ten are continued, each once (the mock's request log),
admitted in the order the proxy listed them running before the crash (the order it hands them
on), at least 2 s apart, and never more than 2 between admission and a seen start."""

from __future__ import annotations

import itertools
import time
from functools import partial
from pathlib import Path

import pytest

from proxy.demo.model import MockModel

from .http_client import request
from .opencode_server import OpencodeServer, opencode_binary
from .polling import poll
from .proxy_process import ProxyProcess, running
from .resumes import continuations, final, following
from .turns import Runtime, wait_turn_done
from .turns import observe_running as observe

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SESSIONS = 10
TIMEOUT_S = 180.0


def running_now(proxy: ProxyProcess) -> list[str]:
    reply = request("GET", f"{proxy.url}/_settle/resume", timeout=15)
    assert reply.status == 200, reply.body
    listed: list[str] = reply.json()["running"]
    return listed


def test_ten_sessions_cut_at_once_are_continued_in_order_two_at_a_time_spaced(
    mock_model: MockModel, tmp_path: Path
) -> None:
    server = OpencodeServer(opencode_binary(), tmp_path, mock_model.base_url)
    options = ("--resume", "--write-back", "api", "--grace", "0.5", "--log-format", "json")
    proxy = ProxyProcess(server.url, tmp_path / "proxy.log", options)
    try:
        server.start()
        with running([proxy]):
            poll(partial(following, proxy), what="the proxy following the server", timeout=60)
            prompts: dict[int, tuple[Runtime, str]] = {n: ("v1", f"stampede {n}") for n in range(SESSIONS)}
            turns = {n: observed.turn for n, observed in observe(server.url, server.project, prompts).items()}
            ours = {turn.session_id for turn in turns.values()}
            order = poll(
                lambda: [s for s in running_now(proxy) if s in ours] or None,
                what="the sessions listed running",
                timeout=60,
            )
            assert sorted(order) == sorted(ours)
            crashed_at = time.time()
            server.crash()
            server.restart()
            finals = {
                n: poll(partial(final, proxy.url, turn), what=f"the decision on {n}", timeout=TIMEOUT_S)
                for n, turn in turns.items()
            }
            for turn in turns.values():  # each continuation answered: its request is in the mock's log
                wait_turn_done(server.url, turn, timeout=TIMEOUT_S)
            sent = {n: continuations(mock_model, turn, crashed_at) for n, turn in turns.items()}
    finally:
        server.stop()
    assert {n: d["outcome"] for n, d in finals.items()} == dict.fromkeys(range(SESSIONS), "resumed")
    assert {n: len(requests) for n, requests in sent.items()} == dict.fromkeys(range(SESSIONS), 1)
    by_session = {d["session"]: d for d in finals.values()}
    admitted = [by_session[session]["admitted"] for session in order]
    assert admitted == sorted(admitted), "admitted in the order they were handed on"
    gaps = [later - earlier for earlier, later in itertools.pairwise(admitted)]
    assert all(gap >= 2.0 - 1e-6 for gap in gaps), gaps  # epoch seconds: to within a float's precision
    spans = [(d["admitted"], d["at"]) for d in finals.values()]
    at_once = max(sum(1 for start, end in spans if start <= moment <= end) for moment, _ in spans)
    assert at_once <= 2
