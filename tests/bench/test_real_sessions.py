"""The real-server benchmark refuses figures for a scenario that does not hold: a stale tool the
proxy did not settle, one opencode no longer shows running, or a clean list the proxy changed.

The bodies are the captures of opencode 1.18.33; the "proxy" body is what `rules` makes of them.
"""

from __future__ import annotations

import copy
import json
from email.message import Message
from pathlib import Path
from typing import Any

import pytest

from bench.real_sessions import NotMeasurable, Scenario, check
from rules import Api, Liveness, settle_view
from tests.integration.http_client import Reply
from tests.integration.turns import Runtime, tools_of

CAPTURES = Path(__file__).resolve().parents[1] / "fixtures" / "opencode-1.18.33"
APIS = {"v1": Api.V1, "v2": Api.V2}


def _reply(body: Any, settled: int = 0) -> Reply:
    headers = Message()
    if settled:
        headers["X-Settle-Settled"] = str(settled)
    return Reply(200, headers, json.dumps(body).encode())


def _stale(runtime: Runtime) -> tuple[Scenario, Any]:
    body = json.loads((CAPTURES / f"{runtime}-message-stale-running.json").read_text())
    messages = body if runtime == "v1" else body["data"]
    tool = next(t for m in messages for t in tools_of(m, runtime)[1] if t["state"]["status"] == "running")
    return Scenario(f"{runtime}-list-stale", runtime, "/unused", str(tool["id"])), body


def _settled(runtime: Runtime, body: Any) -> Any:
    found = settle_view(copy.deepcopy(body), APIS[runtime], Liveness("ses_captured", active=False))
    assert found is not None
    return found.document


@pytest.mark.parametrize("runtime", ["v1", "v2"])
def test_a_stale_tool_settled_by_the_proxy_is_measurable(runtime: Runtime) -> None:
    scenario, body = _stale(runtime)
    assert check(scenario, _reply(body), _reply(_settled(runtime, body), settled=1)) == "settled by the proxy"


@pytest.mark.parametrize("runtime", ["v1", "v2"])
def test_a_stale_tool_the_proxy_passed_on_running_is_refused(runtime: Runtime) -> None:
    scenario, body = _stale(runtime)
    with pytest.raises(NotMeasurable, match="left the tool 'running'"):
        check(scenario, _reply(body), _reply(body))


@pytest.mark.parametrize("runtime", ["v1", "v2"])
def test_a_tool_opencode_no_longer_shows_running_is_refused(runtime: Runtime) -> None:
    scenario, body = _stale(runtime)
    settled = _settled(runtime, body)
    with pytest.raises(NotMeasurable, match="not running"):
        check(scenario, _reply(settled), _reply(settled, settled=1))


def test_a_clean_list_must_pass_unchanged() -> None:
    _, body = _stale("v1")
    clean = Scenario("v1-list-clean", "v1", "/unused")
    assert check(clean, _reply(body), _reply(body)) == "unchanged"
    with pytest.raises(NotMeasurable, match="changed a clean list"):
        check(clean, _reply(body), _reply(_settled("v1", body), settled=1))
