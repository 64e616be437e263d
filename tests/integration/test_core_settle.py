"""End to end: the proxy settles tool calls orphaned by a crash, and nothing else.

One crash/restart cycle serves the whole module (`scene`): stale v1 and v2 sessions are created
before it, and after the restart a v1 and a v2 session are started in a second project directory
and left busy. Each test then compares what opencode serves directly with what the proxy serves.

Timing: opencode's bash tool gives up after 120 s by default, so a "really running" tool only
stays running that long; the tests that need one check that premise first.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .event_tap import EventTap
from .expected import V2_TOOL_ERROR, assert_v1_settled, assert_v2_settled
from .http_client import Reply, request
from .opencode_server import OpencodeServer, directory_header
from .polling import poll
from .proxy_process import wait_all_decided
from .turns import (
    RUNTIMES,
    Observed,
    Runtime,
    find_running_tool,
    observe_running,
    payload,
    read_messages,
    start_turn,
    wait_tool_running,
)

pytestmark = pytest.mark.integration

SETTLED_HEADER = "x-settle-settled"


@dataclass(frozen=True)
class CrashScene:
    """`stale`: running in the main project when the server was SIGKILLed, then restarted.
    `busy_elsewhere`: started after the restart in another project and still running."""

    stale: dict[Runtime, Observed]
    busy_elsewhere: dict[Runtime, Observed]


def _observe_turns(base_url: str, directory: Path, label: str) -> dict[Runtime, Observed]:
    """A running tool in one turn per runtime."""
    return observe_running(
        base_url, directory, {runtime: (runtime, f"{label} {runtime}") for runtime in RUNTIMES}
    )


@pytest.fixture(scope="module")
def scene(opencode: OpencodeServer, other_project: Path) -> CrashScene:
    """The module's single crash/restart cycle (restarts are the slow part of this suite)."""
    stale = _observe_turns(opencode.url, opencode.project, "stale")
    opencode.crash()
    opencode.restart()
    busy_elsewhere = _observe_turns(opencode.url, other_project, "busy elsewhere")
    return CrashScene(stale, busy_elsewhere)


def _get_ok(url: str) -> Reply:
    reply = request("GET", url)
    assert reply.status == 200, f"GET {url} -> {reply.status}: {reply.body[:500]!r}"
    return reply


def _settled_count(reply: Reply) -> int:
    """The proxy's count of rewritten tool calls; an absent header means nothing was rewritten."""
    return int(reply.headers.get(SETTLED_HEADER, "0"))


def _message_id(message: dict[str, Any], runtime: Runtime) -> str:
    return str(message["info"]["id"] if runtime == "v1" else message["id"])


def _pick_message(body: Any, runtime: Runtime, message_id: str) -> dict[str, Any]:
    """The message `message_id` out of a list or single-message body of either runtime."""
    listed = payload(body, runtime)
    if isinstance(listed, dict):
        return listed
    matches: list[dict[str, Any]] = [m for m in listed if _message_id(m, runtime) == message_id]
    assert len(matches) == 1, f"message {message_id} appears {len(matches)} times"
    return matches[0]


def _other_messages(body: Any, runtime: Runtime, message_id: str) -> list[dict[str, Any]]:
    """Every message of a list body except `message_id` (empty for a single-message body)."""
    listed = payload(body, runtime)
    if isinstance(listed, dict):
        return []
    return [m for m in listed if _message_id(m, runtime) != message_id]


def _assert_passes_through(opencode_url: str, proxy_url: str, observed: Observed) -> None:
    """Both routes of the proxy serve exactly what opencode serves, and say nothing was settled."""
    for path in observed.paths():
        direct = _get_ok(opencode_url + path)
        proxied = _get_ok(proxy_url + path)
        assert proxied.json() == direct.json(), f"proxy rewrote {path}"
        assert _settled_count(proxied) == 0, f"{SETTLED_HEADER} on an untouched {path}"


def _assert_still_running(opencode_url: str, observed: Observed, why: str) -> None:
    """The premise of a test: opencode itself still shows this exact tool as running."""
    found = find_running_tool(read_messages(opencode_url, observed.turn), observed.turn.runtime)
    assert found is not None, f"premise broken ({why}): the tool is no longer running in opencode's own view"
    assert found.tool["id"] == observed.running.tool["id"], f"premise broken ({why}): another tool is running"


def _fetch_settled(proxy_url: str, path: str) -> Reply:
    """Fetch through the proxy twice: a settled view must be stable, timestamps included."""
    first = _get_ok(proxy_url + path)
    second = _get_ok(proxy_url + path)
    assert first.body == second.body, f"two fetches of {path} differ"
    assert _settled_count(first) == 1, (
        f"{path}: expected {SETTLED_HEADER}: 1, got {first.headers.get(SETTLED_HEADER)}"
    )
    return first


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_running_tool_passes_through_untouched(
    runtime: Runtime, opencode: OpencodeServer, proxy_url: str
) -> None:
    """(a) While the tool really runs, the proxy serves opencode's view unchanged."""
    turn = start_turn(runtime, opencode.url, opencode.project, f"live {runtime}")
    observed = Observed(turn, wait_tool_running(opencode.url, turn))
    _assert_passes_through(opencode.url, proxy_url, observed)
    _assert_still_running(opencode.url, observed, "checked right after the comparison")


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_crash_leaves_tool_running_in_direct_view(
    runtime: Runtime, scene: CrashScene, opencode: OpencodeServer
) -> None:
    """The bug is real: after SIGKILL + restart opencode still says `running`, yet nothing runs it."""
    observed = scene.stale[runtime]
    _assert_still_running(opencode.url, observed, "the crash should leave the stale part behind")
    if runtime == "v1":
        live = _get_ok(f"{opencode.url}/session/status").json()
    else:
        live = _get_ok(f"{opencode.url}/api/session/active").json()["data"]
    assert observed.turn.session_id not in live


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_stale_tool_settled_in_proxy_view(
    runtime: Runtime, scene: CrashScene, opencode: OpencodeServer, proxy_url: str
) -> None:
    """(b) Both message routes show the orphaned call as interrupted (v2) or the part as aborted
    (v1), the rest as stored."""
    observed = scene.stale[runtime]
    tool_id, message_id = observed.running.tool["id"], observed.running.message_id
    assert_settled = assert_v1_settled if runtime == "v1" else assert_v2_settled
    for path in observed.paths():
        direct = _get_ok(opencode.url + path).json()
        proxied = _fetch_settled(proxy_url, path).json()
        assert_settled(
            _pick_message(direct, runtime, message_id), _pick_message(proxied, runtime, message_id), tool_id
        )
        assert _other_messages(proxied, runtime, message_id) == _other_messages(direct, runtime, message_id)
        if runtime == "v2":
            assert proxied.get("cursor") == direct.get("cursor")


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_busy_session_in_other_directory_untouched(
    runtime: Runtime, scene: CrashScene, opencode: OpencodeServer, proxy_url: str
) -> None:
    """(c) A tool running in another directory stays `running` through the proxy.

    For v1 this is the trap: `/session/status` asked without the session's directory does not
    list it, so a proxy that asks the wrong instance would settle a live call.
    """
    observed = scene.busy_elsewhere[runtime]
    _assert_still_running(opencode.url, observed, "started seconds ago with a 600 s sleep")
    if runtime == "v1":
        default_instance = _get_ok(f"{opencode.url}/session/status").json()
        own_instance = request(
            "GET", f"{opencode.url}/session/status", headers=directory_header(observed.turn.directory)
        ).json()
        assert observed.turn.session_id not in default_instance
        assert own_instance.get(observed.turn.session_id) == {"type": "busy"}
    _assert_passes_through(opencode.url, proxy_url, observed)


def _metric(proxy_url: str, line_prefix: str) -> float:
    """One sample of the proxy's Prometheus exposition (0 when it has not been counted yet)."""
    text = _get_ok(f"{proxy_url}/_settle/metrics").body.decode()
    values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(line_prefix)]
    return sum(values)


def test_steady_state_needs_no_liveness_request_per_fetch(
    scene: CrashScene, opencode: OpencodeServer, proxy_url: str
) -> None:
    """Once the proxy follows /global/event, repeated fetches of a settled view ask nothing more."""
    poll(
        lambda: _get_ok(f"{proxy_url}/_settle/health").json()["liveness"]["source"] == "events" or None,
        what="the proxy following /global/event",
        timeout=10,
    )
    fetches = 5
    for runtime in RUNTIMES:
        path = scene.stale[runtime].turn.messages_path
        for _ in range(fetches):
            assert _settled_count(_get_ok(proxy_url + path)) == 1
        asked = _metric(proxy_url, f'settle_proxy_liveness_requests_total{{api="{runtime}"}}')
        assert asked == 1, f"{runtime}: {asked} liveness requests for {fetches} fetches"


TOOL_FAILED = "session.next.tool.failed"
_PROXY_GRACE_S = 2.0
"""The proxy's default grace period: it confirms an orphan that long after a stream opens."""


def _is_tool_failed(event: Any) -> bool:
    return isinstance(event, dict) and event.get("type") == TOOL_FAILED


def test_v2_session_stream_of_a_stale_session_is_told_the_call_failed(
    scene: CrashScene, opencode: OpencodeServer, proxy_url: str
) -> None:
    """(live, v2) A client following the session's events gets the history as the server replays
    it, then the `tool.failed` the server would have sent, without a sequence number."""
    observed = scene.stale["v2"]
    path = f"/api/session/{observed.session_id}/event"
    with EventTap(opencode.url + path) as direct, EventTap(proxy_url + path) as through:
        failed = through.wait_for(_is_tool_failed, what="tool.failed through the proxy", timeout=15.0)
        told_by_server = [event for event in direct.payloads() if _is_tool_failed(event)]
        history = [event for event in direct.payloads() if "durable" in event]
        relayed = [event for event in through.payloads() if "durable" in event]
    assert told_by_server == [], "premise: the server says nothing of the orphaned call"
    assert relayed == history
    assert "durable" not in failed
    assert failed["data"]["callID"] == observed.tool_id
    assert failed["data"]["assistantMessageID"] == observed.message_id
    assert failed["data"]["error"] == V2_TOOL_ERROR


def test_v2_session_stream_of_a_busy_session_is_left_alone(
    scene: CrashScene, opencode: OpencodeServer, proxy_url: str, tmp_path: Path
) -> None:
    observed = scene.busy_elsewhere["v2"]
    path = f"/api/session/{observed.session_id}/event"
    with EventTap(proxy_url + path) as through:
        through.wait_for(lambda event: "durable" in event, what="the replayed history", timeout=15.0)
        wait_all_decided(proxy_url, within=_PROXY_GRACE_S + 10)  # its confirmation decided: active
        events = through.payloads()
    _assert_still_running(opencode.url, observed, "checked right after the stream was watched")
    assert events, "premise: the stream replayed the session's history"
    assert not [event for event in events if _is_tool_failed(event)]
    assert "orphaned call in session streams" not in (tmp_path / "proxy.log").read_text()
