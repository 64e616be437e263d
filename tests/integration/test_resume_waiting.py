"""Resume that does no harm, with the real opencode 1.18.33 and the mock model: three v1 turns
cut by one SIGKILL mid-call, behind one `--resume --write-back api` proxy.

The safe one (`echo hello && sleep 600`) is continued by itself, once. The unsafe one (`echo hello
&& echo x > out.txt && sleep 600`) is settled and waits: listed in `GET /_settle/resume` with its call, class
and why, never continued by itself, continued once by `POST /_settle/resume/{session}` (a second
POST is 409). The third, unsafe too, waits until its person writes in the session: the wait ends,
nothing is sent for it, and a Continue is 404. Every wait ends on a positive signal: a decision,
a listing, a count of the model's requests."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import pytest

from proxy.demo.model import MockModel, Plan

from .http_client import request
from .opencode_server import OpencodeServer, opencode_binary
from .polling import poll
from .proxy_process import ProxyProcess, running
from .resumes import NAMED_CALL, continuations, decided, final, following
from .turns import Observed, send_prompt
from .turns import observe_running as observe

pytestmark = [pytest.mark.integration, pytest.mark.slow]

UNSAFE = "echo hello && echo x > out.txt && sleep 600"
"""Unsafe for its `>`; it prints first, as the harness needs to see a v1 call stably running."""
PERSON_TEXT = "a person takes the waiting session back"
TIMEOUT_S = 90.0


@dataclass(frozen=True)
class Cut:
    server: OpencodeServer
    proxy: ProxyProcess
    turns: dict[str, Observed]
    crashed_at: float


@pytest.fixture(scope="module")
def cut(mock_model: MockModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cut]:
    root = tmp_path_factory.mktemp("resume-waiting")
    server = OpencodeServer(opencode_binary(), root, mock_model.base_url)
    options = ("--resume", "--write-back", "api", "--grace", "0.5", "--log-format", "json")
    proxy = ProxyProcess(server.url, root / "proxy.log", options)
    for prompt in ("waits unsafe", "waits for its person"):
        mock_model.plan(prompt, Plan(command=UNSAFE))
    mock_model.plan(PERSON_TEXT, Plan(tool="none"))
    try:
        server.start()
        with running([proxy]):
            poll(partial(following, proxy), what="the proxy following the server", timeout=60)
            turns = observe(
                server.url,
                server.project,
                {
                    "safe": ("v1", "resumes safe"),
                    "unsafe": ("v1", "waits unsafe"),
                    "person": ("v1", "waits for its person"),
                },
            )
            crashed_at = time.time()
            server.crash()
            server.restart()
            yield Cut(server, proxy, turns, crashed_at)
    finally:
        server.stop()


def waiting(proxy: ProxyProcess) -> dict[str, dict[str, Any]]:
    reply = request("GET", f"{proxy.url}/_settle/resume", timeout=15)
    assert reply.status == 200, reply.body
    return {listed["session"]: listed for listed in reply.json()["waiting"]}


def outcome(proxy: ProxyProcess, observed: Observed, wanted: str) -> dict[str, Any] | None:
    made = decided(proxy.url, observed.turn)
    found = [d for d in made or [] if d["outcome"] == wanted]
    return found[-1] if found else None


def test_a_safe_turn_is_continued_by_itself_once(cut: Cut, mock_model: MockModel) -> None:
    turn = cut.turns["safe"].turn
    decision = poll(partial(final, cut.proxy.url, turn), what="the safe turn's decision", timeout=TIMEOUT_S)
    assert decision["outcome"] == "resumed", decision
    assert [(c["tool"], c["class"]) for c in decision["calls"]] == [("bash", "safe")]
    sent = poll(
        lambda: continuations(mock_model, turn, cut.crashed_at) or None,
        what="the continuation",
        timeout=TIMEOUT_S,
    )
    assert len(sent) == 1
    assert NAMED_CALL in (sent[0].latest_prompt or "")


def test_an_unsafe_turn_waits_and_a_continue_resumes_it_once(cut: Cut, mock_model: MockModel) -> None:
    observed = cut.turns["unsafe"]
    turn = observed.turn
    decision = poll(
        partial(outcome, cut.proxy, observed, "waiting"), what="the unsafe turn waiting", timeout=TIMEOUT_S
    )
    [call] = decision["calls"]
    assert (call["tool"], call["class"], call["command"]) == ("bash", "unsafe", UNSAFE)
    assert "'>': redirects to a file (out.txt)" in call["why"]
    listed = waiting(cut.proxy)[turn.session_id]
    assert listed["calls"] == [call]
    assert listed["since"] >= cut.crashed_at
    assert continuations(mock_model, turn, cut.crashed_at) == [], "never continued by itself"
    first = request("POST", f"{cut.proxy.url}/_settle/resume/{turn.session_id}", timeout=15)
    assert first.status == 202, first.body
    resumed = poll(
        partial(outcome, cut.proxy, observed, "resumed"), what="the continued turn", timeout=TIMEOUT_S
    )
    assert resumed["calls"] == [call]
    second = request("POST", f"{cut.proxy.url}/_settle/resume/{turn.session_id}", timeout=15)
    assert second.status == 409, second.body
    assert "continued already" in second.json()["message"]
    sent = poll(
        lambda: continuations(mock_model, turn, cut.crashed_at) or None,
        what="the continuation reaching the model",
        timeout=TIMEOUT_S,
    )
    assert len(sent) == 1
    assert f"- bash: `{UNSAFE}`" in (sent[0].latest_prompt or "")
    assert turn.session_id not in waiting(cut.proxy)


def test_a_persons_own_message_ends_the_wait(cut: Cut, mock_model: MockModel) -> None:
    observed = cut.turns["person"]
    turn = observed.turn
    poll(partial(outcome, cut.proxy, observed, "waiting"), what="the turn waiting", timeout=TIMEOUT_S)
    send_prompt(cut.server.url, turn, PERSON_TEXT)
    poll(
        lambda: True if turn.session_id not in waiting(cut.proxy) else None,
        what="the wait ended by the person's message",
        timeout=TIMEOUT_S,
    )
    refused = request("POST", f"{cut.proxy.url}/_settle/resume/{turn.session_id}", timeout=15)
    assert refused.status == 404, refused.body
    assert "the wait ended: a newer message" in refused.json()["message"]
    assert continuations(mock_model, turn, cut.crashed_at) == []
