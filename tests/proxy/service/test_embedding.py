"""Mounting settlement inside an existing aiohttp application."""

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from yarl import URL

from proxy import Settings, mount
from proxy.service.app import ASSEMBLY, create_app
from proxy.testing import WAIT_S
from proxy.writeback.locations import Locations
from proxy.writeback.modes import WriteBackMode
from rules import Api
from tests.fixtures import compact
from tests.proxy.fake_opencode import FakeOpencode

V2 = "ses_dd6bd0f33ffejRStwdnQDIkDom"
V1 = "ses_dd6bcdaa7ffenxavFWr4GKPq95"
V1_MESSAGE, V1_PART = "msg_229432faa0010ifWjJPo42f8Zo", "prt_229433856001UdZM6dtgAYZqVe"


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
    asked = [request.path for request in fake.seen if request.path.startswith("/api/session/")]
    assert asked[-2:] == [f"/api/session/{V2}/message", "/api/session/active"]
    echoed = await (await client.get("/opencode/echo?x=1")).json()
    assert echoed["path_qs"] == "/echo?x=1"
    assert (await client.get("/opencode/_settle/health")).status == 200


def test_unset_locations_are_the_process_environment_s(monkeypatch: pytest.MonkeyPatch) -> None:
    """An embedding app leaves where the write-back works unset: `create_app` and `mount` find
    opencode's defaults in the process environment; what it sets is kept."""
    monkeypatch.setenv("XDG_DATA_HOME", "/process/data")
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/process/run")
    upstream = URL("http://127.0.0.1:4096")
    made = create_app(Settings(upstream=upstream, lock_dir=Path("/locks")))
    assert made[ASSEMBLY].where == Locations(Path("/process/data/opencode/opencode.db"), Path("/locks"))
    mounted = mount(web.Application(), "/opencode", Settings(upstream=upstream))
    assert mounted[ASSEMBLY].where == Locations(
        Path("/process/data/opencode/opencode.db"), Path("/process/run/settle-proxy")
    )


def paging_upstream() -> web.Application:
    """Pages of a v1 message list with the `Link` opencode 1.18.33 builds (from `Host` and
    `x-forwarded-proto`, as its `HttpServerRequest.toURL` does), and a redirect or two."""

    async def page(request: web.Request) -> web.Response:
        proto = "https" if request.headers.get("x-forwarded-proto") == "https" else "http"
        here = URL(f"{proto}://{request.headers['Host']}{request.path_qs}")
        before = request.query.get("before")
        if before == "msg_1":
            return web.json_response([{"info": {"id": "msg_1"}, "parts": []}])
        following = here.update_query(limit=request.query["limit"], before="msg_1")
        return web.json_response(
            [{"info": {"id": "msg_2"}, "parts": []}],
            headers={
                "Access-Control-Expose-Headers": "Link, X-Next-Cursor",
                "Link": f'<{following}>; rel="next"',
                "X-Next-Cursor": "msg_1",
            },
        )

    async def moved(request: web.Request) -> web.Response:
        return web.Response(status=302, headers={"Location": request.query["to"]})

    app = web.Application()
    app.router.add_get("/session/{session}/message", page)
    app.router.add_get("/moved", moved)
    return app


async def test_links_the_upstream_builds_keep_the_mount_prefix(
    aiohttp_server: Callable[[web.Application], Awaitable[TestServer]],
    aiohttp_client: Callable[[web.Application], Awaitable[TestClient[web.Request, web.Application]]],
) -> None:
    upstream = await aiohttp_server(paging_upstream())
    app = web.Application()
    mount(app, "/opencode", Settings(upstream=URL(str(upstream.make_url("/")))))
    client = await aiohttp_client(app)
    origin = str(client.make_url("/")).rstrip("/")

    first = await client.get("/opencode/session/ses_x/message?limit=1")
    assert (
        first.headers["Link"] == f'<{origin}/opencode/session/ses_x/message?limit=1&before=msg_1>; rel="next"'
    )
    assert first.headers["X-Next-Cursor"] == "msg_1"
    (following,) = [link for link in first.links.values()]
    second = await client.get(URL(str(following["url"])).path_qs)
    assert await second.json() == [{"info": {"id": "msg_1"}, "parts": []}]

    public = await client.get(
        "/opencode/session/ses_x/message?limit=1",
        headers={"Host": "opencode.example", "X-Forwarded-Proto": "https"},
    )
    assert public.headers["Link"].startswith("<https://opencode.example/opencode/session/ses_x/message?")

    for target, expected in [
        ("/session/ses_x", "/opencode/session/ses_x"),
        (f"{origin}/doc?x=1", f"{origin}/opencode/doc?x=1"),
        ("https://github.com/login", "https://github.com/login"),
        ("//elsewhere.example/x", "//elsewhere.example/x"),
        ("relative/path", "relative/path"),
    ]:
        redirect = await client.get("/opencode/moved", params={"to": target}, allow_redirects=False)
        assert redirect.headers["Location"] == expected


async def test_a_proxy_on_its_own_leaves_links_as_they_came(
    aiohttp_server: Callable[[web.Application], Awaitable[TestServer]],
    aiohttp_client: Callable[[web.Application], Awaitable[TestClient[web.Request, web.Application]]],
) -> None:
    upstream = await aiohttp_server(paging_upstream())
    client = await aiohttp_client(create_app(Settings(upstream=URL(str(upstream.make_url("/"))))))
    origin = str(client.make_url("/")).rstrip("/")
    first = await client.get("/session/ses_x/message?limit=1")
    assert first.headers["Link"] == f'<{origin}/session/ses_x/message?limit=1&before=msg_1>; rel="next"'
    redirect = await client.get("/moved", params={"to": "/session/ses_x"}, allow_redirects=False)
    assert redirect.headers["Location"] == "/session/ses_x"


async def test_an_embedding_app_awaits_a_write_back_through_the_assembly(
    fake: FakeOpencode,
    upstream: TestServer,
    aiohttp_client: Callable[[web.Application], Awaitable[TestClient[web.Request, web.Application]]],
    tmp_path: Path,
) -> None:
    """The README's promise: `app[ASSEMBLY].write_back.settled(api, session, ids)` returns once the
    named ids are decided, each with how it ended."""
    settings = Settings(
        upstream=URL(str(upstream.make_url("/"))), grace=0.05, write_back=WriteBackMode.API, lock_dir=tmp_path
    )
    client = await aiohttp_client(create_app(settings))
    fake.bodies[f"/session/{V1}/message"] = compact("v1-message-stale-running.json")
    await (await client.get(f"/session/{V1}/message")).read()
    write_back = client.app[ASSEMBLY].write_back
    assert write_back is not None
    async with asyncio.timeout(WAIT_S):
        outcomes = await write_back.settled(Api.V1, V1, [V1_PART])
    assert {part: str(outcome) for part, outcome in outcomes.items()} == {V1_PART: "written"}
    assert [path for path, _ in fake.patches] == [f"/session/{V1}/message/{V1_MESSAGE}/part/{V1_PART}"]
