"""The proxy never weakens opencode's password, never logs a secret, and can guard itself."""

import base64
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from yarl import URL

from proxy.opencode.dialects import HEALTH_PATHS
from proxy.service.app import create_app
from proxy.service.config import Settings, basic_authorization
from tests.fixtures import compact
from tests.proxy.conftest import ProxyClient, proxy_process
from tests.proxy.fake_opencode import FakeOpencode

V1 = "ses_dd6bcdaa7ffenxavFWr4GKPq95"
PASSWORD = "s3cret-Pa55"
GOOD = basic_authorization("opencode", PASSWORD)
TOKEN = base64.b64encode(f"opencode:{PASSWORD}".encode()).decode()
ClientFactory = Callable[[web.Application], Awaitable[ProxyClient]]


@pytest.fixture
async def guarded_upstream_proxy(
    fake: FakeOpencode, upstream: TestServer, aiohttp_client: ClientFactory
) -> ProxyClient:
    """The upstream wants a password, and the proxy knows it (OPENCODE_SERVER_PASSWORD)."""
    fake.password = PASSWORD
    fake.bodies[f"/session/{V1}/message"] = compact("v1-message-stale-running.json")
    settings = Settings(upstream=URL(str(upstream.make_url("/"))), authorization=GOOD)
    return await aiohttp_client(create_app(settings))


async def test_a_client_without_credentials_gets_the_upstreams_401(
    guarded_upstream_proxy: ProxyClient,
) -> None:
    for path in (f"/session/{V1}/message", "/session/status", "/global/health", "/event"):
        response = await guarded_upstream_proxy.get(path)
        assert response.status == 401, path
        assert response.headers["www-authenticate"] == 'Basic realm="Secure Area"'
        assert "running" not in await response.text()


@pytest.mark.parametrize("how", ["header", "token"])
async def test_basic_and_auth_token_both_work_and_settle(
    guarded_upstream_proxy: ProxyClient, how: str
) -> None:
    path = f"/session/{V1}/message"
    if how == "header":
        response = await guarded_upstream_proxy.get(path, headers={"Authorization": GOOD})
    else:
        response = await guarded_upstream_proxy.get(path, params={"auth_token": TOKEN})
    assert response.status == 200
    assert (await response.json())[1]["parts"][1]["state"]["status"] == "error"


async def test_wrong_credentials_are_not_replaced_by_the_proxys(
    guarded_upstream_proxy: ProxyClient, fake: FakeOpencode
) -> None:
    response = await guarded_upstream_proxy.get(
        f"/session/{V1}/message", headers={"Authorization": "Basic d3Jvbmc6d3Jvbmc="}
    )
    assert response.status == 401
    forwarded = [r for r in fake.seen if r.path == f"/session/{V1}/message"]
    assert [r.headers.get("Authorization") for r in forwarded] == ["Basic d3Jvbmc6d3Jvbmc="]


@pytest.fixture
async def self_guarded_proxy(upstream: TestServer, aiohttp_client: ClientFactory) -> ProxyClient:
    settings = Settings(upstream=URL(str(upstream.make_url("/"))), auth=("opencode", PASSWORD))
    return await aiohttp_client(create_app(settings))


async def test_auth_guards_every_route_before_the_upstream(
    self_guarded_proxy: ProxyClient, fake: FakeOpencode
) -> None:
    for path in ("/echo", "/_settle/health", "/_settle/metrics", "/_settle/up", "/pty/x/connect"):
        response = await self_guarded_proxy.get(path)
        assert response.status == 401, path
        assert response.headers["WWW-Authenticate"] == 'Basic realm="settle-proxy"'
    # What the proxy asks on its own: which server this is, its stream, the default directory.
    own = (*HEALTH_PATHS, "/global/event", "/path")
    assert [r.path for r in fake.seen if r.path not in own] == []


async def test_auth_passes_the_clients_credentials_on(self_guarded_proxy: ProxyClient) -> None:
    echoed = await (await self_guarded_proxy.get("/echo", headers={"Authorization": GOOD})).json()
    assert echoed["headers"]["Authorization"] == GOOD
    assert (await self_guarded_proxy.get("/echo", params={"auth_token": TOKEN})).status == 200
    assert (await self_guarded_proxy.get("/echo", headers={"Authorization": GOOD + "x"})).status == 401


async def test_secrets_never_reach_the_log(fake: FakeOpencode, upstream: TestServer, tmp_path: Path) -> None:
    """A debug-level run that authenticates, settles and fails liveness once: no secret in its log."""
    fake.password = PASSWORD
    fake.bodies[f"/session/{V1}/message"] = compact("v1-message-stale-running.json")
    env = {**os.environ, "OPENCODE_SERVER_PASSWORD": PASSWORD, "SETTLE_AUTH": f"opencode:{PASSWORD}"}
    log_path = tmp_path / "proxy.log"
    async with (
        proxy_process(upstream, log_path, "--log-level", "debug", env=env) as proxy,
        aiohttp.ClientSession(headers={"Authorization": GOOD}) as client,
    ):
        settled = await client.get(proxy.with_path(f"/session/{V1}/message"), params={"auth_token": TOKEN})
        assert settled.headers["X-Settle-Settled"] == "1"
        fake.liveness_fails = True
        await client.get(proxy.with_path("/api/session/ses_x/message"))
        fake.bodies["/api/session/ses_y/message"] = compact("v2-message-stale-running.json")
        await client.get(proxy.with_path("/api/session/ses_y/message"))
    log = log_path.read_text()
    assert "settled orphaned-tool" in log
    assert "liveness of ses_y unknown" in log
    for secret in (PASSWORD, TOKEN, GOOD):
        assert secret not in log


def test_binding_beyond_loopback_is_warned_about(unused_tcp_port_factory: Callable[[], int]) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "proxy", "--host", "0.0.0.0", "--port", str(unused_tcp_port_factory())],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stderr is not None
        first = process.stderr.readline()
    finally:
        process.terminate()
        process.communicate(timeout=10)
    assert "WARNING" in first
    assert "clients beyond this machine can reach the proxy" in first
