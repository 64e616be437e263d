"""A client that leaves is noticed by the relay itself, whatever the application it is mounted
in: aiohttp's `run_app` and `AppRunner` do not cancel the handler of a client that went away
(handler_cancellation=False), and a quiet stream gives no failed write to notice it by."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import pytest
from aiohttp import web
from yarl import URL

from proxy import Settings, mount
from proxy.testing import WAIT_S

CLIENTS = 20
_CONNECTED = b'data: {"payload":{"type":"server.connected","properties":{}}}\n\n'


class QuietUpstream:
    """Event streams that say they are connected, then nothing; it counts the requests opened and
    those the proxy closed."""

    def __init__(self) -> None:
        self.opened = 0
        self.closed = 0
        self._changed = asyncio.Condition()
        self.asked_directory = asyncio.Event()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/event", self._stream)
        app.router.add_get("/global/event", self._own_subscription)
        app.router.add_get("/slow", self._never_answer)
        app.router.add_get("/path", self._path)
        return app

    async def _path(self, _: web.Request) -> web.Response:
        """The server's default directory, which the proxy asks once it follows the events."""
        self.asked_directory.set()
        return web.json_response({"directory": "/"})

    async def opened_reaches(self, count: int) -> None:
        """Wait (bounded) until `count` requests have reached the upstream."""
        async with asyncio.timeout(WAIT_S), self._changed:
            await self._changed.wait_for(lambda: self.opened >= count)

    async def _never_answer(self, _: web.Request) -> web.Response:
        """A request the upstream keeps thinking about (opencode's v1 prompt answers at the turn's end)."""
        await self._opened()
        try:
            await asyncio.Event().wait()
            raise AssertionError("unreachable")
        finally:
            await self._closed()

    async def _opened(self) -> None:
        self.opened += 1
        async with self._changed:
            self._changed.notify_all()

    async def _closed(self) -> None:
        self.closed += 1
        async with self._changed:
            self._changed.notify_all()

    async def closed_reaches(self, count: int) -> None:
        """Wait (bounded) until `count` streams have been closed by the proxy."""
        async with asyncio.timeout(WAIT_S), self._changed:
            await self._changed.wait_for(lambda: self.closed >= count)

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        await self._opened()
        try:
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await response.write(_CONNECTED)
            await asyncio.Event().wait()
            return response
        finally:
            await self._closed()

    async def _own_subscription(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(_CONNECTED)
        await asyncio.Event().wait()
        return response


@asynccontextmanager
async def served(app: web.Application, *, handler_cancellation: bool = False) -> AsyncIterator[URL]:
    """`app` on a free loopback port, as `web.run_app` serves it (aiohttp's defaults: no handler
    cancellation) unless told otherwise; handlers still running at the end get 2 s to finish."""
    runner = web.AppRunner(
        app, access_log=None, shutdown_timeout=2, handler_cancellation=handler_cancellation
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        yield URL(f"http://{host}:{port}")
    finally:
        await runner.cleanup()


async def _leave_a_quiet_stream(url: URL) -> None:
    async with aiohttp.ClientSession() as session, session.get(url) as stream:
        assert await stream.content.readuntil(b"\n\n") == _CONNECTED


async def _back_to(baseline: set[asyncio.Task[object]]) -> None:
    """Wait (bounded) for every task started since `baseline` to end (the proxy's handlers and
    the upstream's); then no more tasks run than did before."""
    started = asyncio.all_tasks() - baseline - {asyncio.current_task()}
    _, running = await asyncio.wait(started, timeout=WAIT_S) if started else (set(), set())
    assert not running, f"{len(running)} tasks still running: {running}"
    assert len(asyncio.all_tasks()) <= len(baseline)


async def test_clients_leaving_a_quiet_stream_of_an_embedded_proxy_close_it_upstream(
    caplog: pytest.LogCaptureFixture,
) -> None:
    quiet = QuietUpstream()
    async with served(quiet.app(), handler_cancellation=True) as upstream:
        host = web.Application()
        mount(host, "/opencode", Settings(upstream=upstream))
        async with served(host) as proxy:  # as the README's `web.run_app(app)`: no handler cancellation
            stream = proxy.with_path("/opencode/event")
            await _leave_a_quiet_stream(stream)  # once first, so that what stays up is up
            await _closed_or_fail(quiet, 1)
            async with asyncio.timeout(WAIT_S):
                await quiet.asked_directory.wait()  # the proxy's own start-up look-up is done
            baseline = asyncio.all_tasks()
            await asyncio.gather(*(_leave_a_quiet_stream(stream) for _ in range(CLIENTS)))
            await _closed_or_fail(quiet, 1 + CLIENTS)
            await _back_to(baseline)
    assert quiet.opened == 1 + CLIENTS
    assert [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR] == []


async def _closed_or_fail(quiet: QuietUpstream, count: int) -> None:
    try:
        await quiet.closed_reaches(count)
    except TimeoutError:
        pytest.fail(f"{quiet.opened - quiet.closed} of {quiet.opened} upstream requests left open")


async def test_clients_that_stop_waiting_for_a_slow_answer_close_it_upstream() -> None:
    quiet = QuietUpstream()
    async with served(quiet.app(), handler_cancellation=True) as upstream:
        host = web.Application()
        mount(host, "/opencode", Settings(upstream=upstream))
        async with served(host) as proxy, aiohttp.ClientSession() as session:
            waiting = [
                asyncio.create_task(session.get(proxy.with_path("/opencode/slow"))) for _ in range(CLIENTS)
            ]
            await quiet.opened_reaches(CLIENTS)
            for client in waiting:
                client.cancel()  # the client gives up: its connection is closed
            await asyncio.wait(waiting)
            await _closed_or_fail(quiet, CLIENTS)
