"""The related case without a crash (upstream issue #51291): the provider's stream vanishes mid-turn.

Measured on 1.18.33 with the mock model cutting its stream right after the tool-call chunk: v2
ends the turn at once (`finish: "error"`, "HTTP transport failed", no tool item); v1 retries
the model with back-off for about a minute, and every bash part it started ends `completed`.
So 1.18.33 leaves no tool open once the session is idle, and the proxy has nothing to settle:
this test pins that down, and fails if a later release (or the proxy) changes it.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest

from proxy.demo.model import MockModel, Plan

from .http_client import request
from .opencode_server import OpencodeServer, directory_header
from .polling import poll
from .turns import RUNTIMES, Runtime, Turn, read_messages, start_turn

pytestmark = pytest.mark.integration

_IDLE_TIMEOUT_S = 150.0
"""v1 gives up after about 65 s of retries (measured); twice that, plus margin."""
OPEN = {"v1": ("pending", "running"), "v2": ("streaming", "running")}


def _active(opencode: OpencodeServer, turn: Turn) -> bool:
    if turn.runtime == "v1":
        status = request(
            "GET", f"{opencode.url}/session/status", headers=directory_header(turn.directory)
        ).json()
        return turn.session_id in status
    return turn.session_id in request("GET", f"{opencode.url}/api/session/active").json()["data"]


def _tool_states(messages: list[dict[str, Any]], runtime: Runtime) -> list[str]:
    if runtime == "v1":
        return [p["state"]["status"] for m in messages for p in m["parts"] if p["type"] == "tool"]
    return [c["state"]["status"] for m in messages for c in m.get("content", []) if c["type"] == "tool"]


def _finished(opencode: OpencodeServer, turn: Turn) -> list[dict[str, Any]] | None:
    """The turn's messages once the server has closed its assistant message and gone idle."""
    messages = read_messages(opencode.url, turn)
    if turn.runtime == "v1":
        answers = [m["info"] for m in messages if m["info"]["role"] == "assistant"]
    else:
        answers = [m for m in messages if m["type"] == "assistant"]
    if answers and all("completed" in a["time"] for a in answers) and not _active(opencode, turn):
        return messages
    return None


def test_cut_stream_leaves_nothing_open(
    mock_model: MockModel, opencode: OpencodeServer, proxy_url: str
) -> None:
    turns = {}
    for runtime in RUNTIMES:
        mock_model.plan(f"cut stream {runtime}", Plan(cut_stream=True))
        turns[runtime] = start_turn(runtime, opencode.url, opencode.project, f"cut stream {runtime}")
    for runtime, turn in turns.items():
        direct = poll(
            partial(_finished, opencode, turn), what=f"{runtime} turn over", timeout=_IDLE_TIMEOUT_S
        )
        assert not [s for s in _tool_states(direct, runtime) if s in OPEN[runtime]], direct
        assert read_messages(proxy_url, turn) == direct
    cut = [r for r in mock_model.requests() if r.prompt and r.prompt.startswith("cut stream")]
    assert len(cut) >= 2, "the model was asked for both turns, and cut both streams"
