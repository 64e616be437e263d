"""Idle and slow clients: a connection with no request under way, or whose request head is still
arriving, is closed after the keep-alive timeout (nginx's 75 s; aiohttp's own is an hour), while a
slow answer or a quiet event stream is never cut by it. Small timeouts here, the runner `serve` uses."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import pytest
from aiohttp import web
from yarl import URL

from proxy.cli import serving
from proxy.service.app import create_app
from proxy.service.config import Settings
from tests.reliability.servers import serve

KEEPALIVE_S = 0.3
QUIET_S = 1.0
"""Longer than the keep-alive timeout: how long the upstream keeps a client waiting."""
CLOSED_WITHIN_S = 10.0


async def _slow(_request: web.Request) -> web.Response:
    await asyncio.sleep(QUIET_S)
    return web.json_response({"done": True})


async def _quiet_stream(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(b"data: {}\n\n")
    await asyncio.sleep(QUIET_S)
    await response.write(b'data: {"late":true}\n\n')
    return response


@asynccontextmanager
async def proxy(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[str, int]]:
    monkeypatch.setattr(serving, "KEEPALIVE_TIMEOUT_S", KEEPALIVE_S)
    upstream = web.Application()
    upstream.router.add_get("/slow", _slow)
    upstream.router.add_get("/event", _quiet_stream)
    async with serve(upstream) as url:
        runner = serving.app_runner(create_app(Settings(upstream=url)))
        await runner.setup()
        try:
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            host, port = runner.addresses[0][:2]
            yield host, port
        finally:
            await runner.cleanup()


async def _closed_by_the_server(reader: asyncio.StreamReader) -> bytes:
    return await asyncio.wait_for(reader.read(), CLOSED_WITHIN_S)


async def test_an_idle_connection_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    async with proxy(monkeypatch) as (host, port):
        reader, writer = await asyncio.open_connection(host, port)
        assert await _closed_by_the_server(reader) == b""
        writer.close()


async def test_a_kept_alive_connection_is_closed_once_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    async with proxy(monkeypatch) as (host, port):
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"GET /_settle/up HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = await _closed_by_the_server(reader)
        assert answer.startswith(b"HTTP/1.1 ")
        writer.close()


async def test_a_request_head_that_never_ends_is_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    async with proxy(monkeypatch) as (host, port):
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"GET /_settle/up HTTP/1.1\r\nHo")
        assert await _closed_by_the_server(reader) == b""
        writer.close()


async def test_a_slow_answer_and_a_quiet_stream_are_never_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    async with proxy(monkeypatch) as (host, port), aiohttp.ClientSession() as client:
        base = URL.build(scheme="http", host=host, port=port)
        async with client.get(base / "slow") as slow:
            assert await slow.json() == {"done": True}
        async with client.get(base / "event") as stream:
            assert await stream.content.read() == b'data: {}\n\ndata: {"late":true}\n\n'
