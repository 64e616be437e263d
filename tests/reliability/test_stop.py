"""SIGTERM with a client on an event stream: the proxy stops accepting, cuts the stream as a crash
would (no last chunk, so the client reconnects), lets a short request finish, and exits. Before,
aiohttp waited on the stream's handler for its shutdown timeout, twice: two minutes."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from proxy.service.app import create_app
from proxy.service.config import Settings
from tests.reliability.servers import ProxySubprocess, serve

EXIT_WITHIN_S = 30.0
"""Far above the second or so a stop takes, far below the two minutes it took: a stop that hangs
fails the test instead of holding it up."""
CONNECTED = b'data: {"type":"server.connected","properties":{}}\n\n'


class HeldStreams:
    """An upstream whose event streams stay open for good, and whose `/slow` answers after a pause."""

    def __init__(self) -> None:
        self.slow_started = asyncio.Event()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/slow", self._slow)
        app.router.add_get("/{stream:(global/)?event}", self._stream)
        return app

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(CONNECTED)
        await asyncio.Event().wait()
        return response

    async def _slow(self, _request: web.Request) -> web.Response:
        self.slow_started.set()
        await asyncio.sleep(0.3)
        return web.json_response({"slow": True})


@asynccontextmanager
async def proxy_before(upstream: HeldStreams, tmp_path: Path) -> AsyncIterator[ProxySubprocess]:
    async with serve(upstream.app()) as url:
        proxy = ProxySubprocess(url, tmp_path / "proxy.log")
        await proxy.start()
        try:
            yield proxy
        finally:
            await proxy.stop()


async def test_sigterm_cuts_open_streams_finishes_short_requests_and_exits(tmp_path: Path) -> None:
    upstream = HeldStreams()
    async with proxy_before(upstream, tmp_path) as proxy, aiohttp.ClientSession() as client:
        stream = await client.get(proxy.url / "event")
        assert await stream.content.readuntil(b"\n\n") == CONNECTED
        slow = asyncio.create_task(client.get(proxy.url / "slow"))
        await asyncio.wait_for(upstream.slow_started.wait(), EXIT_WITHIN_S)

        process = proxy._running()
        process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.wait(), EXIT_WITHIN_S)

        assert process.returncode == 0, proxy.log()
        answer = await slow
        assert (answer.status, await answer.json()) == (200, {"slow": True})
        with pytest.raises(aiohttp.ClientPayloadError):
            await stream.content.read()


async def test_an_embedding_apps_stop_cuts_streams_at_once_whatever_its_shutdown_timeout() -> None:
    """An application that runs the proxy with aiohttp's own timeouts (60 s) stops as quickly."""
    upstream = HeldStreams()
    async with serve(upstream.app()) as url, aiohttp.ClientSession() as client:
        runner = web.AppRunner(create_app(Settings(upstream=url)), handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        stream = await client.get(f"http://{host}:{port}/event")
        assert await stream.content.readuntil(b"\n\n") == CONNECTED

        await asyncio.wait_for(runner.cleanup(), EXIT_WITHIN_S)

        with pytest.raises(aiohttp.ClientPayloadError):
            await stream.content.read()
