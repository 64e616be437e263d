"""`settle_proxy_liveness_requests` counts every look-up made upstream, whoever made it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import orjson
from aiohttp import web
from aiohttp.test_utils import TestServer
from yarl import URL

from proxy.service.app import create_app
from proxy.service.config import Settings
from proxy.testing import idle
from proxy.writeback.modes import WriteBackMode
from tests.fixtures import compact, load, raw
from tests.proxy.conftest import ProxyClient, following, publish
from tests.proxy.fake_opencode import FakeOpencode

V1 = "ses_dd6bcdaa7ffenxavFWr4GKPq95"
V2 = "ses_dd6bd0f33ffejRStwdnQDIkDom"
ClientFactory = Callable[[web.Application], Awaitable[ProxyClient]]


async def proxy_for(upstream: TestServer, aiohttp_client: ClientFactory, **settings: object) -> ProxyClient:
    base = URL(str(upstream.make_url("/")))
    client = await aiohttp_client(create_app(Settings(upstream=base, grace=0.05, **settings)))  # type: ignore[arg-type]
    await following(client)
    return client


async def lookups(proxy: ProxyClient, api: str) -> float:
    text = await (await proxy.get("/_settle/metrics")).text()
    wanted = f'settle_proxy_liveness_requests_total{{api="{api}"}} '
    return sum(float(line.removeprefix(wanted)) for line in text.splitlines() if line.startswith(wanted))


async def test_a_views_look_up_is_counted(
    upstream: TestServer, aiohttp_client: ClientFactory, fake: FakeOpencode
) -> None:
    proxy = await proxy_for(upstream, aiohttp_client)
    fake.bodies[f"/session/{V1}/message"] = compact("v1-message-stale-running.json")
    await (await proxy.get(f"/session/{V1}/message")).read()
    assert fake.liveness_requests == await lookups(proxy, "v1") == 1


async def test_a_write_backs_look_up_is_counted(
    upstream: TestServer, aiohttp_client: ClientFactory, fake: FakeOpencode, tmp_path: Path
) -> None:
    proxy = await proxy_for(upstream, aiohttp_client, write_back=WriteBackMode.API, lock_dir=tmp_path)
    fake.bodies[f"/session/{V1}/message"] = compact("v1-message-stale-running.json")
    await (await proxy.get(f"/session/{V1}/message")).read()
    await idle(proxy.app)
    assert fake.patches, "the write-back ran"
    # The view's, the write-back's, and the confirmation for the client streams (`SettledViews`).
    assert fake.liveness_requests == await lookups(proxy, "v1") == 3


async def test_live_settles_look_up_is_counted(
    upstream: TestServer, aiohttp_client: ClientFactory, fake: FakeOpencode
) -> None:
    message = load("v1-message-stale-running.json")[1]
    fake.bodies[f"/session/{V1}/message/{message['info']['id']}"] = orjson.dumps(message)
    proxy = await proxy_for(upstream, aiohttp_client)
    await publish(proxy, fake, "message.part.updated", V1, part=message["parts"][1], time=1)
    await publish(proxy, fake, "session.status", V1, status={"type": "idle"})
    await idle(proxy.app)
    assert fake.liveness_requests >= 1
    assert await lookups(proxy, "v1") == fake.liveness_requests


async def test_a_session_streams_look_up_is_counted(
    upstream: TestServer, aiohttp_client: ClientFactory, fake: FakeOpencode
) -> None:
    fake.bodies[f"/api/session/{V2}/message"] = compact("v2-message-stale-running.json")
    fake.session_history[V2] = [
        line for line in raw("sse-v2-session-events-busy.txt").splitlines() if line.startswith(b"{")
    ]
    proxy = await proxy_for(upstream, aiohttp_client)
    response = await proxy.get(f"/api/session/{V2}/event")
    await idle(proxy.app)
    response.close()
    assert fake.liveness_requests == await lookups(proxy, "v2") == 1
