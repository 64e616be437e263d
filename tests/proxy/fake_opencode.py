"""An in-process stand-in for `opencode serve`, just big enough to drive the proxy's unit tests."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import orjson
from aiohttp import WSMsgType, web


@dataclass
class FakeOpencode:
    """State the tests set: message bodies per path, and what liveness says."""

    bodies: dict[str, bytes] = field(default_factory=dict)
    v2_active: set[str] = field(default_factory=set)
    v1_busy: dict[str, set[str]] = field(default_factory=dict)
    """Busy v1 sessions per directory: v1 status is per directory instance."""
    directories: dict[str, str] = field(default_factory=dict)
    seen: list[web.Request] = field(default_factory=list)
    liveness_requests: int = 0
    liveness_fails: bool = False

    def app(self) -> web.Application:
        app = web.Application()
        app.middlewares.append(self._record)
        app.router.add_get("/api/session/active", self._v2_active)
        app.router.add_get("/session/status", self._v1_status)
        app.router.add_get("/session/{session}", self._v1_session)
        app.router.add_route("*", "/echo", self._echo)
        app.router.add_get("/gzip", self._gzip)
        app.router.add_get("/events", self._events)
        app.router.add_get("/pty/{id}/connect", self._pty)
        app.router.add_get("/{tail:.*}", self._body)
        return app

    @web.middleware
    async def _record(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        self.seen.append(request)
        return await handler(request)

    def _count_liveness(self) -> None:
        self.liveness_requests += 1
        if self.liveness_fails:
            raise web.HTTPServiceUnavailable()

    async def _v2_active(self, _: web.Request) -> web.Response:
        self._count_liveness()
        return web.json_response({"data": {session: {"type": "running"} for session in self.v2_active}})

    async def _v1_status(self, request: web.Request) -> web.Response:
        self._count_liveness()
        busy = self.v1_busy.get(request.query.get("directory", "/cwd"), set())
        return web.json_response({session: {"type": "busy"} for session in busy})

    async def _v1_session(self, request: web.Request) -> web.Response:
        session = request.match_info["session"]
        return web.json_response({"id": session, "directory": self.directories.get(session, "/cwd")})

    async def _echo(self, request: web.Request) -> web.Response:
        headers: Mapping[str, str] = {name: value for name, value in request.headers.items()}
        body = await request.read()
        return web.json_response(
            {
                "method": request.method,
                "path_qs": request.raw_path,
                "headers": headers,
                "body": body.decode(),
            },
            headers={"Connection": "close, X-Hop", "X-Hop": "1", "X-End": "2"},
        )

    async def _gzip(self, request: web.Request) -> web.Response:
        body = orjson.dumps({"big": "x" * 2048})
        if "gzip" in request.headers.get("Accept-Encoding", ""):
            return web.Response(
                body=gzip.compress(body),
                content_type="application/json",
                headers={"Content-Encoding": "gzip"},
            )
        return web.Response(body=body, content_type="application/json")

    async def _events(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for number in range(int(request.query.get("count", "3"))):
            await response.write(f"data: {number}\n\n".encode())
            await asyncio.sleep(float(request.query.get("gap", "0.05")))
        return response

    async def _pty(self, request: web.Request) -> web.WebSocketResponse:
        socket = web.WebSocketResponse()
        await socket.prepare(request)
        async for message in socket:
            if message.type is WSMsgType.TEXT:
                await socket.send_str(f"echo:{message.data}")
            elif message.type is WSMsgType.BINARY:
                await socket.send_bytes(message.data[::-1])
        return socket

    async def _body(self, request: web.Request) -> web.Response:
        body = self.bodies.get(request.path)
        if body is None:
            raise web.HTTPNotFound()
        return web.Response(body=body, content_type="application/json")
