"""Which credentials an upstream call carries: the client's own, else the configured ones."""

import asyncio
from collections.abc import Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from yarl import URL

from proxy import testing
from proxy.opencode import client
from proxy.opencode.client import AUTH_TOKEN_PARAM, Credentials, UpstreamApi


def test_the_clients_header_then_its_token_then_the_configured_header() -> None:
    header = testing.flow(headers={"Authorization": "Basic own"}).request
    assert Credentials.for_request(header, "Basic configured").headers == {"Authorization": "Basic own"}
    token = testing.flow(path=f"/x?{AUTH_TOKEN_PARAM}=abc").request
    assert Credentials.for_request(token, "Basic configured") == Credentials(params={AUTH_TOKEN_PARAM: "abc"})
    bare = testing.flow().request
    assert Credentials.for_request(bare, "Basic configured").headers == {"Authorization": "Basic configured"}
    assert Credentials.for_request(bare, None) == Credentials()


async def test_a_call_the_server_holds_for_good_is_cut_short(
    aiohttp_server: Callable[[web.Application], Awaitable[TestServer]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shared session has no total timeout (it carries `/global/event`); each call has its own."""
    monkeypatch.setattr(client, "CALL_TIMEOUT_S", 0.1)

    async def held(_: web.Request) -> web.Response:
        await asyncio.Event().wait()
        raise AssertionError("never answers")

    app = web.Application()
    app.router.add_get("/path", held)
    server = await aiohttp_server(app)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, connect=5)) as session:
        api = UpstreamApi(session, URL(str(server.make_url("/"))))
        with pytest.raises(TimeoutError):
            await api.get("/path", Credentials())
