"""The bench's relay target: the proxy's stack with no addons, so every body arrives as sent."""

from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from yarl import URL

from bench.bare_relay import relay_app

STALE_VIEW = b'[{"info":{"id":"msg_1"},"parts":[{"type":"tool","state":{"status":"running"}}]}]'


async def _upstream_handler(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    await response.prepare(request)
    for piece in (STALE_VIEW[:20], STALE_VIEW[20:]):
        await response.write(piece)
    await response.write_eof()
    return response


async def test_a_message_view_with_an_open_tool_passes_byte_for_byte(
    aiohttp_server: Callable[[web.Application], Awaitable[TestServer]],
    aiohttp_client: Callable[[web.Application], Awaitable[TestClient[web.Request, web.Application]]],
) -> None:
    """The proxy would settle this view; the relay alone, with no addon, must not touch it."""
    upstream = web.Application()
    upstream.router.add_get("/api/session/{id}/message", _upstream_handler)
    server = await aiohttp_server(upstream)
    client = await aiohttp_client(relay_app(URL(str(server.make_url("/")))))
    response = await client.get("/api/session/ses_1/message")
    assert response.status == 200
    assert await response.read() == STALE_VIEW
