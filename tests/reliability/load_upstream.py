"""A fast in-process stand-in for opencode with every route the load mix touches, served from memory.

Message views come from the captures of the real server: per runtime one session whose tool
was orphaned (inactive: the proxy must settle it), one whose tool really runs (active: must
pass byte for byte) and one without an open tool (must pass without any look-up).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from rules import Api, Liveness, settle_view
from tests.fixtures import compact

V2_STALE, V2_BUSY, V2_DONE = "ses_load_v2_stale", "ses_load_v2_busy", "ses_load_v2_done"
V1_STALE, V1_BUSY, V1_DONE = "ses_load_v1_stale", "ses_load_v1_busy", "ses_load_v1_done"
_EVENT_GAP_S = 0.005
BIG_PATTERN = bytes(range(256)) * 256
"""64 KiB; `/big` repeats it, so a client can check any download without keeping a copy."""
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class View:
    """A message-list route, what the upstream serves there, and what a client must receive."""

    path: str
    served: bytes
    expected: Any
    """Parsed: the settled document for a stale session, else the served document unchanged."""
    settled: bool


def _view(api: Api, session_id: str, capture: str, *, stale: bool) -> View:
    prefix = "/api/session" if api is Api.V2 else "/session"
    served = compact(capture)
    document = orjson.loads(served)
    if stale:
        settled = settle_view(document, api, Liveness(session_id, active=False))
        assert settled is not None, f"{capture} has nothing to settle"
        document = settled.document
    return View(f"{prefix}/{session_id}/message", served, document, stale)


VIEWS = (
    _view(Api.V2, V2_STALE, "v2-message-stale-running.json", stale=True),
    _view(Api.V2, V2_BUSY, "v2-message-stale-running.json", stale=False),
    _view(Api.V2, V2_DONE, "v2-message-interrupted.json", stale=False),
    _view(Api.V1, V1_STALE, "v1-message-stale-running.json", stale=True),
    _view(Api.V1, V1_BUSY, "v1-message-stale-running.json", stale=False),
    _view(Api.V1, V1_DONE, "v1-message-aborted.json", stale=False),
)


class LoadUpstream:
    """The fake server; `in_flight` counts the client requests it is still serving.

    The proxy's own `/global/event` subscription is not counted: it is meant to stay open. Any
    other request still in flight after its client left is an upstream connection the proxy
    failed to close.
    """

    def __init__(self) -> None:
        self.in_flight = 0
        self.websocket_close_codes: list[int | None] = []
        self._bodies = {view.path: view.served for view in VIEWS}

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._count])
        app.router.add_get("/small", self._small)
        app.router.add_get("/big", self._big)
        app.router.add_get("/slow", self._slow)
        app.router.add_get("/pty/{id}/connect", self._pty)
        app.router.add_post("/echo", self._echo)
        app.router.add_get("/event", self._events)
        app.router.add_get("/global/event", self._global_events)
        app.router.add_get("/global/health", self._health)
        app.router.add_get("/api/session/active", self._v2_active)
        app.router.add_get("/session/status", self._v1_status)
        app.router.add_get("/session/{session}/message", self._messages)
        app.router.add_get("/api/session/{session}/message", self._messages)
        app.router.add_get("/session/{session}", self._v1_session)
        return app

    @web.middleware
    async def _count(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        counted = request.path != "/global/event"
        self.in_flight += counted
        try:
            return await handler(request)
        finally:
            self.in_flight -= counted

    async def _health(self, _: web.Request) -> web.Response:
        return web.json_response({"healthy": True, "version": "1.18.33"})

    async def _small(self, _: web.Request) -> web.Response:
        return web.json_response({"healthy": True, "version": "1.18.33"})

    async def _echo(self, request: web.Request) -> web.Response:
        return web.Response(body=await request.read(), content_type="application/octet-stream")

    async def _messages(self, request: web.Request) -> web.Response:
        return web.Response(body=self._bodies[request.path], content_type="application/json")

    async def _v2_active(self, _: web.Request) -> web.Response:
        return web.json_response({"data": {V2_BUSY: {"type": "running"}}})

    async def _v1_status(self, _: web.Request) -> web.Response:
        return web.json_response({V1_BUSY: {"type": "busy"}})

    async def _v1_session(self, request: web.Request) -> web.Response:
        return web.json_response({"id": request.match_info["session"], "directory": "/cwd"})

    async def _events(self, request: web.Request) -> web.StreamResponse:
        """An endless stream of small events, as `/event` is while a turn runs."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        number = 0
        while True:
            await response.write(b'data: {"type":"server.heartbeat","n":%d}\n\n' % number)
            number += 1
            await asyncio.sleep(_EVENT_GAP_S)

    async def _big(self, request: web.Request) -> web.StreamResponse:
        """`?size=` bytes of `BIG_PATTERN`, written in 64 KiB pieces as fast as they are taken."""
        size = int(request.query["size"])
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        response.content_length = size
        await response.prepare(request)
        for start in range(0, size, len(BIG_PATTERN)):
            await response.write(BIG_PATTERN[: size - start])
        return response

    async def _slow(self, request: web.Request) -> web.Response:
        await asyncio.sleep(float(request.query["delay"]))
        return web.json_response({"slow": True})

    async def _pty(self, request: web.Request) -> web.WebSocketResponse:
        """Echo, and remember how each connection was closed (the proxy must close it for a client)."""
        socket = web.WebSocketResponse()
        await socket.prepare(request)
        async for message in socket:
            await socket.send_str(f"echo:{message.data}")
        self.websocket_close_codes.append(socket.close_code)
        return socket

    async def _global_events(self, request: web.Request) -> web.StreamResponse:
        """The proxy's own subscription: connected, then quiet, so kept readings stay valid."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"payload":{"type":"server.connected","properties":{}}}\n\n')
        await asyncio.Event().wait()
        return response
