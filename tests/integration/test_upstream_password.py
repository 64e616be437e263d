"""A server with a password (`OPENCODE_SERVER_PASSWORD`): views are settled, and auth is never weakened.

opencode 1.18.33 with a password answers a request without the right Basic credentials with 401.
The proxy forwards the client's `Authorization` as it came and asks liveness with the client's
credentials, or with its own from `OPENCODE_SERVER_PASSWORD` when it was given them; it never
lends its own to a client that has none, which would make it an open door to the server.

One crash/restart cycle serves the module: a stale v1 and v2 turn on a server with a password.
Every test runs against a proxy without credentials of its own and one with them.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from proxy.demo.model import MockModel

from .expected import V1_PART_ERROR, V2_TOOL_ERROR
from .http_client import Reply, get_json, request, with_credentials
from .opencode_server import OpencodeServer, running_opencode
from .polling import poll
from .proxy_process import ProxyProcess
from .turns import (
    RUNTIMES,
    Observed,
    Runtime,
    fetch_settled,
    find_running_tool,
    observe_running,
    payload,
    read_messages,
)

pytestmark = pytest.mark.integration

PASSWORD = "correct horse battery staple"
PROXY_CREDENTIALS = ("none", "own")
"""Proxies under test: without credentials of their own, and with `OPENCODE_SERVER_PASSWORD`."""

_EVENTS_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class Guarded:
    """A password-protected server after a crash and restart, and its stale turns."""

    server: OpencodeServer
    stale: dict[Runtime, Observed]


@pytest.fixture(scope="module")
def guarded(mock_model: MockModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Guarded]:
    root = tmp_path_factory.mktemp("password")
    with running_opencode(root, mock_model.base_url, password=PASSWORD) as server:
        prompts = {runtime: (runtime, f"guarded {runtime}") for runtime in RUNTIMES}
        stale = observe_running(server.url, server.project, prompts)
        server.crash()
        server.restart()
        yield Guarded(server, stale)


@pytest.fixture(params=PROXY_CREDENTIALS)
def proxy(request: pytest.FixtureRequest, guarded: Guarded, tmp_path: Path) -> Iterator[ProxyProcess]:
    environment = {"OPENCODE_SERVER_PASSWORD": PASSWORD} if request.param == "own" else {}
    process = ProxyProcess(guarded.server.origin, tmp_path / "proxy.log", environment=environment)
    try:
        process.start()
        yield process
    finally:
        process.stop()


def _tool(messages: list[dict[str, Any]], runtime: Runtime, tool_id: str) -> dict[str, Any]:
    key = "parts" if runtime == "v1" else "content"
    found: list[dict[str, Any]] = [
        item for message in messages for item in message.get(key, []) if item.get("id") == tool_id
    ]
    assert len(found) == 1, f"tool {tool_id} appears {len(found)} times"
    return found[0]


def _same_refusal(direct: Reply, proxied: Reply) -> None:
    assert direct.status == 401, f"premise: the server should refuse, got {direct.status}"
    assert proxied.status == 401, f"the proxy let through what the server refuses: {proxied.status}"
    assert proxied.body == direct.body
    assert proxied.headers.get("WWW-Authenticate") == direct.headers.get("WWW-Authenticate")
    assert proxied.headers.get("X-Settle-Settled") is None


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_client_with_credentials_sees_the_stale_tool_settled(
    runtime: Runtime, guarded: Guarded, proxy: ProxyProcess
) -> None:
    observed = guarded.stale[runtime]
    direct = find_running_tool(read_messages(guarded.server.url, observed.turn), runtime)
    assert direct is not None, "premise: opencode still says running"
    assert direct.tool["id"] == observed.tool_id, "premise: the same tool"

    through = with_credentials(proxy.url, "opencode", PASSWORD)
    settled = fetch_settled(through + observed.turn.messages_path)
    state = _tool(payload(settled.json(), runtime), runtime, observed.tool_id)["state"]

    assert state["status"] == "error"
    assert state["error"] == (V1_PART_ERROR if runtime == "v1" else V2_TOOL_ERROR)


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("password", [None, "wrong"], ids=["no-credentials", "wrong-password"])
def test_client_without_the_password_gets_the_servers_own_401(
    runtime: Runtime, password: str | None, guarded: Guarded, proxy: ProxyProcess
) -> None:
    path = guarded.stale[runtime].turn.messages_path
    direct_base, proxy_base = guarded.server.origin, proxy.url
    if password is not None:
        direct_base, proxy_base = (
            with_credentials(b, "opencode", password) for b in (direct_base, proxy_base)
        )
    _same_refusal(request("GET", direct_base + path), request("GET", proxy_base + path))


def test_only_a_proxy_given_the_password_follows_the_event_stream(
    guarded: Guarded, proxy: ProxyProcess
) -> None:
    """With its own credentials the proxy keeps liveness from `/global/event`; without, the server
    refuses to tell it which server it is (so it follows no stream) and it asks on every fetch,
    with the fetching client's credentials, which server it is and whether the session is live."""
    if _knows_the_password(proxy):
        health = with_credentials(proxy.url, "opencode", PASSWORD) + "/_settle/health"
        poll(
            lambda: True if get_json(health)["liveness"]["source"] == "events" else None,
            what="the event stream",
            timeout=_EVENTS_TIMEOUT_S,
        )
    else:
        poll(
            lambda: True if "/global/health answered HTTP 401" in proxy.log() else None,
            what="the proxy refused its own look-up of which server this is",
            timeout=_EVENTS_TIMEOUT_S,
        )
        through = with_credentials(proxy.url, "opencode", PASSWORD)
        state = _tool(read_messages(through, guarded.stale["v1"].turn), "v1", guarded.stale["v1"].tool_id)
        assert state["state"]["status"] == "error"


def _knows_the_password(proxy: ProxyProcess) -> bool:
    return "OPENCODE_SERVER_PASSWORD" in proxy.environment


SETTLE_ROUTES = ("/_settle/health", "/_settle/metrics", "/_settle/orphans")
_TOKEN = base64.b64encode(f"opencode:{PASSWORD}".encode()).decode()
_WRONG_TOKEN = base64.b64encode(b"opencode:wrong").decode()


@pytest.mark.parametrize("route", SETTLE_ROUTES)
def test_the_proxys_own_routes_want_the_servers_password(
    route: str, guarded: Guarded, proxy: ProxyProcess
) -> None:
    """Checked by the proxy against the password it was given; a proxy given none shows nothing,
    since the real server answers it 401 (it cannot check what it does not know)."""
    wrong = [
        request("GET", proxy.url + route),
        request("GET", with_credentials(proxy.url, "opencode", "wrong") + route),
        request("GET", f"{proxy.url}{route}?auth_token={_WRONG_TOKEN}"),
    ]
    right = [
        request("GET", with_credentials(proxy.url, "opencode", PASSWORD) + route),
        request("GET", f"{proxy.url}{route}?auth_token={_TOKEN}"),
    ]
    if _knows_the_password(proxy):
        assert [reply.status for reply in wrong] == [401, 401, 401]
        assert [reply.status for reply in right] == [200, 200]
        assert all(reply.headers.get("WWW-Authenticate") == 'Basic realm="settle-proxy"' for reply in wrong)
    else:
        assert [reply.status for reply in wrong + right] == [403] * 5
    for reply in wrong if _knows_the_password(proxy) else wrong + right:
        assert set(reply.json()) == {"error", "message"}, reply.body[:300]


def test_the_probe_says_up_to_anyone_and_nothing_else(guarded: Guarded, proxy: ProxyProcess) -> None:
    reply = request("GET", proxy.url + "/_settle/up")
    assert (reply.status, reply.json()) == (200, {"status": "up"})


def test_a_proxy_without_the_password_names_the_fix_once(guarded: Guarded, tmp_path: Path) -> None:
    """1.18.33 answers the proxy's own look-ups 401: one WARNING names the variables to set, however
    often it is asked again, and the proxy's routes say the same."""
    process = ProxyProcess(guarded.server.origin, tmp_path / "proxy.log")
    fix = (
        "the server wants a password and the proxy has none: set OPENCODE_SERVER_PASSWORD "
        "(on 2.x OPENCODE_PASSWORD) to the server's"
    )
    try:
        process.start()
        poll(lambda: True if fix in process.log() else None, what="the line naming the fix", timeout=15)
        replies = [request("GET", with_credentials(process.url, "opencode", PASSWORD) + "/_settle/health")]
        replies += [request("GET", process.url + "/_settle/metrics") for _ in range(2)]
        assert [reply.status for reply in replies] == [403] * 3
        assert all("OPENCODE_PASSWORD" in reply.json()["message"] for reply in replies)
        said = [line for line in process.log().splitlines() if fix in line]
    finally:
        process.stop()
    assert len(said) == 1, said
    assert " WARNING " in said[0]


def test_a_proxy_given_a_wrong_password_admits_no_one_to_its_details(
    guarded: Guarded, tmp_path: Path
) -> None:
    """1.18.33 refuses the proxy's credentials: whoever presents them is refused what the server
    refuses them, and the server's own cannot be checked without them, so no one is admitted, and
    every refusal says it is the proxy's password that is wrong."""
    process = ProxyProcess(
        guarded.server.origin, tmp_path / "proxy.log", environment={"OPENCODE_SERVER_PASSWORD": "wrong"}
    )
    routes = (*SETTLE_ROUTES, "/_settle/resume")
    try:
        process.start()
        poll(
            lambda: True if "the server refused the password presented" in process.log() else None,
            what="the proxy learnt that the server refuses its password",
            timeout=_EVENTS_TIMEOUT_S,
        )
        direct = request(
            "GET", with_credentials(guarded.server.origin, "opencode", "wrong") + "/global/health"
        )
        replies = [
            request("GET", base + route)
            for route in routes
            for base in (
                with_credentials(process.url, "opencode", "wrong"),
                with_credentials(process.url, "opencode", PASSWORD),
                process.url,
            )
        ]
        replies.append(request("GET", f"{process.url}/_settle/health?auth_token={_WRONG_TOKEN}"))
        replies.append(
            request("POST", with_credentials(process.url, "opencode", "wrong") + "/_settle/resume/ses_x")
        )
        probe = request("GET", process.url + "/_settle/up")
    finally:
        process.stop()
    assert direct.status == 401, "premise: the server refuses the proxy's password"
    assert [reply.status for reply in replies] == [403] * len(replies)
    for reply in replies:
        said = reply.json()
        assert set(said) == {"error", "message"}, reply.body[:300]
        assert said["message"].startswith("the server refuses the proxy's credentials"), said
    assert (probe.status, probe.json()) == (200, {"status": "up"})
