"""The proxy's own routes, dry run, and structured logs."""

import logging
from collections.abc import Awaitable, Callable
from importlib.metadata import version

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from yarl import URL

from proxy import __version__
from proxy.addons.settle import SETTLED_HEADER
from proxy.service.app import create_app
from proxy.service.config import Settings
from proxy.service.logs import JsonFormatter, TextFormatter
from proxy.supervision.server_command import free_loopback_port
from proxy.testing import idle
from tests.fixtures import compact
from tests.proxy.conftest import ProxyClient, following
from tests.proxy.fake_opencode import FakeOpencode

V1 = "ses_dd6bcdaa7ffenxavFWr4GKPq95"
V2 = "ses_dd6bd0f33ffejRStwdnQDIkDom"
ClientFactory = Callable[[web.Application], Awaitable[ProxyClient]]


async def test_health_reports_upstream_and_version(proxy: ProxyClient, fake: FakeOpencode) -> None:
    response = await proxy.get("/_settle/health")
    assert response.status == 200
    health = await response.json()
    assert health["status"] == "ok"
    assert health["upstream"]["reachable"] is True
    assert health["liveness"]["source"] in ("events", "asked on every fetch")
    assert health["version"] == version("settle-proxy") == __version__
    assert all(not request.path.startswith("/_settle") for request in fake.seen)


async def test_health_says_when_upstream_is_down(aiohttp_client: ClientFactory) -> None:
    port = free_loopback_port()
    client = await aiohttp_client(create_app(Settings(upstream=URL(f"http://127.0.0.1:{port}"))))
    response = await client.get("/_settle/up")
    assert response.status == 503
    assert await response.json() == {"status": "down"}
    # Never answered: whether it wants a password is unknown, so its details stay closed (503 too).
    assert (await client.get("/_settle/health")).status == 503


async def test_other_settle_paths_never_reach_upstream(proxy: ProxyClient, fake: FakeOpencode) -> None:
    response = await proxy.post("/_settle/anything/else")
    assert response.status == 404
    assert [request.path for request in fake.seen if request.path.startswith("/_settle")] == []


async def test_metrics_count_requests_and_rewrites(proxy: ProxyClient, fake: FakeOpencode) -> None:
    fake.bodies[f"/session/{V1}/message"] = compact("v1-message-stale-running.json")
    await proxy.get(f"/session/{V1}/message")
    await proxy.get("/missing")
    text = await (await proxy.get("/_settle/metrics")).text()
    assert 'settle_proxy_rewrites_total{api="v1",applied="true",rule="orphaned-tool"} 1.0' in text
    assert 'settle_proxy_rewrites_total{api="v1",applied="true",rule="unfinished-message"} 1.0' in text
    assert 'settle_proxy_requests_total{method="GET",status="404"} 1.0' in text
    assert 'settle_proxy_liveness_requests_total{api="v1"} 1.0' in text
    assert "settle_proxy_upstream_seconds_count 2.0" in text


async def background_busy(client: ProxyClient) -> float:
    text = await (await client.get("/_settle/metrics")).text()
    (line,) = [line for line in text.splitlines() if line.startswith("settle_proxy_background_busy ")]
    return float(line.split()[-1])


@pytest.mark.parametrize("grace", [3600.0, 0.0])
async def test_metrics_say_whether_a_decision_is_still_under_way(
    upstream: TestServer, aiohttp_client: ClientFactory, fake: FakeOpencode, grace: float
) -> None:
    """What a test (or an operator) waits for instead of a pause: 1 while a confirmation, a
    write-back pass or a resume runs, 0 once every one has decided."""
    fake.bodies[f"/api/session/{V2}/message"] = compact("v2-message-stale-running.json")
    client = await aiohttp_client(
        create_app(Settings(upstream=URL(str(upstream.make_url("/"))), grace=grace))
    )
    await following(client)
    await idle(client.app)  # the server's default directory, asked when the stream is followed
    assert await background_busy(client) == 0.0
    async with client.get(f"/api/session/{V2}/event") as stream:
        assert stream.status == 200  # its confirmation started before its headers were relayed
        if grace:
            assert await background_busy(client) == 1.0
        else:
            await idle(client.app)
            assert await background_busy(client) == 0.0


@pytest.fixture
async def dry_proxy(upstream: TestServer, aiohttp_client: ClientFactory) -> ProxyClient:
    return await aiohttp_client(create_app(Settings(upstream=URL(str(upstream.make_url("/"))), dry_run=True)))


async def test_dry_run_changes_nothing_but_logs_and_counts(
    dry_proxy: ProxyClient, fake: FakeOpencode, caplog: pytest.LogCaptureFixture
) -> None:
    fake.bodies[f"/session/{V1}/message"] = original = compact("v1-message-stale-running.json")
    with caplog.at_level(logging.INFO, logger="proxy.addons.settle"):
        response = await dry_proxy.get(f"/session/{V1}/message")
    assert await response.read() == original
    assert SETTLED_HEADER not in response.headers
    lines = [record for record in caplog.records if record.getMessage().startswith("would settle")]
    assert [record.__dict__["fields"]["rule"] for record in lines] == ["orphaned-tool", "unfinished-message"]
    text = await (await dry_proxy.get("/_settle/metrics")).text()
    assert 'settle_proxy_rewrites_total{api="v1",applied="false",rule="orphaned-tool"} 1.0' in text


async def test_one_structured_line_per_settlement(
    proxy: ProxyClient, fake: FakeOpencode, caplog: pytest.LogCaptureFixture
) -> None:
    fake.bodies[f"/session/{V1}/message"] = compact("v1-message-stale-running.json")
    with caplog.at_level(logging.INFO, logger="proxy.addons.settle"):
        await proxy.get(f"/session/{V1}/message", headers={"Authorization": "Basic c2VjcmV0OnNlY3JldA=="})
    (tool_line,) = [r for r in caplog.records if getattr(r, "fields", {}).get("rule") == "orphaned-tool"]
    entry = orjson.loads(JsonFormatter().format(tool_line))
    assert entry["event"] == "settled orphaned-tool"
    assert {key: entry[key] for key in ("session", "message", "part", "tool", "rule", "api")} == {
        "session": V1,
        "message": "msg_229432faa0010ifWjJPo42f8Zo",
        "part": "prt_229433856001UdZM6dtgAYZqVe",
        "tool": "bash",
        "rule": "orphaned-tool",
        "api": "v1",
    }
    assert "open in inactive session" in entry["why"]
    assert "part=prt_229433856001UdZM6dtgAYZqVe" in TextFormatter().format(tool_line)
    assert all(
        "c2VjcmV0" not in record.getMessage() and "secret" not in str(getattr(record, "fields", ""))
        for record in caplog.records
    )


async def test_the_proxys_own_answers_name_no_server_software(aiohttp_client: ClientFactory) -> None:
    """`Server: Python/3.x aiohttp/3.x` would tell anyone who reaches the port what to attack."""
    port = free_loopback_port()
    client = await aiohttp_client(create_app(Settings(upstream=URL(f"http://127.0.0.1:{port}"))))
    for path in ("/_settle/health", "/_settle/metrics", "/_settle/nothing", "/api/session/active"):
        response = await client.get(path)
        assert response.status in (200, 404, 502, 503)
        assert "Server" not in response.headers, path
