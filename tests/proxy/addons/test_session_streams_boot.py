"""A session stream opened while opencode boots is never left hanging: 1.18.33 takes
`/api/session/{id}/event` sent before its health answers and then sends nothing for 40 s and more.
While the server line is not known, a session stream gets the start deadline of every other stream
(a 504 the client reconnects on); once the server is known healthy it is never timed again."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from yarl import URL

from proxy.addons.routing import Routing
from proxy.opencode.client import Credentials
from proxy.opencode.server_line import TOLD_1_18, ServerLine
from proxy.service.app import ASSEMBLY, create_app
from proxy.service.config import Settings
from tests.proxy.addons.test_routing import routed
from tests.proxy.conftest import ProxyClient

SESSION = "ses_booting"
NEWS = b'data: {"type":"session.next.prompt.admitted","properties":{"sessionID":"ses_booting"}}\n\n'
DEADLINE_S = 0.3


class Booting:
    """An opencode that boots: until `booted` its health answers 503, and a session stream sent
    meanwhile is taken and never answered (as 1.18.33 does); once booted, a session stream sends its
    news at once."""

    def __init__(self) -> None:
        self.booted = asyncio.Event()
        self.hanging = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/global/health", self._health)
        app.router.add_get("/global/event", self._stream)
        app.router.add_get("/api/session/{session}/event", self._stream)
        return app

    async def _health(self, _: web.Request) -> web.Response:
        if not self.booted.is_set():
            raise web.HTTPServiceUnavailable()
        return web.json_response({"healthy": True, "version": "1.18.33"})

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        if not self.booted.is_set():
            self.hanging += 1
            await asyncio.Event().wait()  # taken, never answered
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if request.path.startswith("/api/session/"):
            await response.write(NEWS)
        await asyncio.Event().wait()
        return response


@pytest.fixture
def deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("proxy.opencode.routes.STREAM_START_TIMEOUT_S", DEADLINE_S)


async def test_a_session_stream_sent_while_the_server_boots_gets_a_504_then_its_news(
    aiohttp_server: Callable[[web.Application], Awaitable[TestServer]],
    aiohttp_client: Callable[[web.Application], Awaitable[ProxyClient]],
    deadline: None,
) -> None:
    booting = Booting()
    upstream = await aiohttp_server(booting.app())
    proxy = await aiohttp_client(create_app(Settings(upstream=URL(str(upstream.make_url("/"))))))
    async with asyncio.timeout(10):
        first = await proxy.get(f"/api/session/{SESSION}/event")
        first.release()
        booting.booted.set()
        await proxy.app[ASSEMBLY].started.line.detected()  # its health answers
        again = await proxy.get(f"/api/session/{SESSION}/event")
        news = await again.content.readline()
        again.close()
    assert first.status == 504
    assert booting.hanging >= 1
    assert again.status == 200
    assert news == NEWS.split(b"\n")[0] + b"\n"


async def test_a_session_stream_is_timed_only_while_the_server_is_not_known(deadline: None) -> None:
    unknown = ServerLine(None, Credentials())
    path = f"/api/session/{SESSION}/event"
    assert (await routed(path, 30.0, routing=Routing(line=unknown))).start_timeout == DEADLINE_S
    assert (await routed(path, 30.0, routing=Routing(line=ServerLine.told(TOLD_1_18)))).start_timeout is None
