"""Mounting settlement inside an existing aiohttp application."""

from collections.abc import Awaitable, Callable

import orjson
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from yarl import URL

from proxy import Settings, mount
from tests.fixtures import compact
from tests.proxy.fake_opencode import FakeOpencode

V2 = "ses_dd6bd0f33ffejRStwdnQDIkDom"


async def test_mounted_under_a_prefix(
    fake: FakeOpencode,
    upstream: TestServer,
    aiohttp_client: Callable[[web.Application], Awaitable[TestClient[web.Request, web.Application]]],
) -> None:
    async def own_route(_: web.Request) -> web.Response:
        return web.Response(text="mine")

    app = web.Application()
    app.router.add_get("/hello", own_route)
    mount(app, "/opencode", Settings(upstream=URL(str(upstream.make_url("/")))))
    client = await aiohttp_client(app)
    fake.bodies[f"/api/session/{V2}/message"] = compact("v2-message-stale-running.json")

    assert await (await client.get("/hello")).text() == "mine"
    response = await client.get(f"/opencode/api/session/{V2}/message")
    assert orjson.loads(await response.read())["data"][0]["content"][0]["state"]["status"] == "error"
    assert [request.path for request in fake.seen[-2:]] == [
        f"/api/session/{V2}/message",
        "/api/session/active",
    ]
    echoed = await (await client.get("/opencode/echo?x=1")).json()
    assert echoed["path_qs"] == "/echo?x=1"
    assert (await client.get("/opencode/_settle/health")).status == 200
