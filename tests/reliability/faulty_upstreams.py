"""A proxy in front of a faulty upstream, and what a client of it gets: shared by the upstream
fault and timeout tests.

A raw upstream (`proxy_in_front`) sends whatever bytes a test gives it; an aiohttp one
(`proxy_in_front_of_streams`) serves an event stream with gaps and a PTY WebSocket that can drop
its connection as a killed server does.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from yarl import URL

from proxy.service.app import create_app
from proxy.service.config import Settings
from tests.reliability.raw_upstream import Received, Reply, Responder, raw_upstream
from tests.reliability.servers import serve

V2 = "ses_fault_v2"
MESSAGES = f"/api/session/{V2}/message"
PLAIN = "/config"
CLIENT_TIMEOUT = aiohttp.ClientTimeout(total=20)


@asynccontextmanager
async def proxy_in_front(
    responder: Responder, *, response_timeout: float | None = None, **settings: Any
) -> AsyncIterator[URL]:
    """An in-process proxy in front of a raw upstream answering with `responder`."""
    async with raw_upstream(responder) as (upstream, _):
        app = create_app(Settings(upstream=upstream, response_timeout=response_timeout, **settings))
        async with serve(app) as proxy:
            yield proxy


def always(reply: Reply) -> Responder:
    async def respond(_: Received) -> Reply:
        return reply

    return respond


async def never(_: Received) -> Reply:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


async def get(url: URL) -> tuple[int, dict[str, str], bytes]:
    async with aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as session, session.get(url) as answer:
        return answer.status, dict(answer.headers), await answer.read()


async def assert_still_serves(proxy: URL) -> None:
    """The proxy still answers its own routes: its open probe says whether the upstream is up."""
    status, _, body = await get(proxy.with_path("/_settle/up"))
    assert (status, orjson.loads(body)) in ((200, {"status": "up"}), (503, {"status": "down"})), body[:300]


async def assert_json_error(url: URL, status: int, error: str) -> None:
    """The proxy's own JSON error, never aiohttp's plain-text 500."""
    got, headers, body = await get(url)
    assert (got, headers["Content-Type"].split(";")[0]) == (status, "application/json"), body[:300]
    assert orjson.loads(body)["error"] == error


async def _events(request: web.Request) -> web.StreamResponse:
    """Three events `?gap=` seconds apart."""
    events = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await events.prepare(request)
    for number in range(3):
        if number:
            await asyncio.sleep(float(request.query["gap"]))
        await events.write(b"data: %d\n\n" % number)
    return events


async def _pty(request: web.Request) -> web.WebSocketResponse:
    """Echoes text; on "die" drops its TCP connection without a close frame, as a killed server does."""
    socket = web.WebSocketResponse()
    await socket.prepare(request)
    async for message in socket:
        if message.data == "die" and request.transport is not None:
            request.transport.abort()
            break
        await socket.send_str(f"echo:{message.data}")
    return socket


@asynccontextmanager
async def proxy_in_front_of_streams(response_timeout: float | None = None) -> AsyncIterator[URL]:
    """A proxy in front of an aiohttp upstream serving `/events` and `/pty/{id}/connect`."""
    app = web.Application()
    app.router.add_get("/events", _events)
    app.router.add_get("/pty/{id}/connect", _pty)
    async with serve(app) as upstream:
        proxy_app = create_app(Settings(upstream=upstream, response_timeout=response_timeout))
        async with serve(proxy_app) as proxy:
            yield proxy
