"""An in-process stand-in for `opencode serve`, just big enough to drive the proxy's unit tests."""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from email.utils import formatdate
from typing import Any

import orjson
from aiohttp import WSMsgType, web

from tests.fixtures import js_json


def _web_app() -> web.Response:
    return web.Response(text="<!doctype html><title>opencode</title>", content_type="text/html")


@dataclass
class FakeOpencode:
    """State the tests set: message bodies per path, and what liveness says."""

    bodies: dict[str, bytes] = field(default_factory=dict)
    headers: dict[str, dict[str, str]] = field(default_factory=dict)
    """Headers sent with a body of `bodies`, whatever the request asked (e.g. a `Content-Encoding`)."""
    v2_active: set[str] = field(default_factory=set)
    v1_busy: dict[str, set[str]] = field(default_factory=dict)
    """Busy v1 sessions per directory: v1 status is per directory instance."""
    directories: dict[str, str] = field(default_factory=dict)
    seen: list[web.Request] = field(default_factory=list)
    liveness_requests: int = 0
    liveness_fails: bool = False
    patches: list[tuple[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    """The durable event log, as `/sync/history` rows."""
    before_replay: list[dict[str, Any]] = field(default_factory=list)
    """Events the "server" appends itself just before the next replay: a concurrent append."""
    replays: list[tuple[int, Any]] = field(default_factory=list)
    streams: list[asyncio.Queue[bytes | None]] = field(default_factory=list)
    """One queue per open `/global/event` stream; None ends it (as a server restart would)."""
    subscribers: int = 0
    release: asyncio.Event = field(default_factory=asyncio.Event)
    """`/events` holds back everything after its first event until this is set."""
    session_history: dict[str, list[bytes]] = field(default_factory=dict)
    """What `/api/session/{id}/event` replays (one JSON event a line) before it goes quiet."""
    password: str | None = None
    """When set, every route wants Basic `opencode:<password>` or `?auth_token=`, as opencode does."""
    clock_skew_ms: int = 0
    events_refused: bool = False
    """When set, `/global/event` answers 401, so a proxy has to ask on every fetch."""
    """How far the "server's" clock (its `Date` header) is ahead of the test's."""
    default_directory: str = "/cwd"
    """The directory the "server" runs in: what `GET /path` names, and what plain `/event` follows."""
    path_fails: bool = False
    """When set, `GET /path` answers 503, as a server still starting may."""
    version: str = "1.18.33"
    """Which server this is: 1.x names it on `/global/health`, 2.x on `/api/info` (and then has no
    `/global/health`, and no `/global/event`)."""
    web_app: bool = False
    """When set, a route with nothing to serve answers a web app's HTML page (200), as a server
    behind a web-app fallback does."""
    on_serve: dict[str, list[Callable[[], None]]] = field(default_factory=dict)
    """Per path, hooks for its next requests: the first runs just before the next one is answered."""

    def app(self) -> web.Application:
        app = web.Application()
        app.middlewares.append(self._record)
        app.on_response_prepare.append(self._date)
        app.router.add_get("/global/health", self._health)
        app.router.add_get("/api/info", self._info)
        app.router.add_get("/api/session/active", self._v2_active)
        app.router.add_get("/session/status", self._v1_status)
        app.router.add_get("/session/{session}", self._v1_session)
        app.router.add_route("*", "/echo", self._echo)
        app.router.add_get("/gzip", self._gzip)
        app.router.add_get("/events", self._events)
        app.router.add_get("/global/event", self._global_events)
        app.router.add_get("/event", self._instance_events)
        app.router.add_get("/path", self._path)
        app.router.add_get("/pty/{id}/connect", self._pty)
        app.router.add_patch("/session/{session}/message/{message}/part/{part}", self._patch_part)
        app.router.add_post("/sync/history", self._history)
        app.router.add_post("/sync/replay", self._replay)
        app.router.add_get("/api/session/{session}", self._v2_session)
        app.router.add_get("/api/session/{session}/event", self._session_events)
        app.router.add_get("/{tail:.*}", self._body)
        return app

    @web.middleware
    async def _record(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        self.seen.append(request)
        hooks = self.on_serve.get(request.path)
        if hooks:
            hooks.pop(0)()
        if self.password is not None and not self._authorized(request):
            return web.json_response(
                {"_tag": "UnauthorizedError"},
                status=401,
                headers={"www-authenticate": 'Basic realm="Secure Area"'},
            )
        return await handler(request)

    async def _date(self, _: web.Request, response: web.StreamResponse) -> None:
        response.headers["Date"] = formatdate(time.time() + self.clock_skew_ms / 1000, usegmt=True)

    def _authorized(self, request: web.Request) -> bool:
        token = base64.b64encode(f"opencode:{self.password}".encode()).decode()
        return (
            request.headers.get("Authorization") == f"Basic {token}"
            or request.query.get("auth_token") == token
        )

    def _count_liveness(self) -> None:
        self.liveness_requests += 1
        if self.liveness_fails:
            raise web.HTTPServiceUnavailable()

    @property
    def is_2x(self) -> bool:
        return not self.version.startswith("1.")

    async def _health(self, _: web.Request) -> web.Response:
        if self.web_app:
            return _web_app()
        if self.is_2x:
            raise web.HTTPNotFound()
        return web.json_response({"healthy": True, "version": self.version})

    async def _info(self, _: web.Request) -> web.Response:
        """`ServerInfo` (packages/protocol/src/groups/server.ts @51819a10a412, anomalyco/opencode)."""
        if self.web_app:
            return _web_app()
        if not self.is_2x:
            raise web.HTTPNotFound()
        return web.json_response({"version": self.version, "pid": 1, "urls": [], "paths": {"tmp": "/tmp"}})

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
        await response.write(b"data: 0\n\n")
        await self.release.wait()
        for number in range(1, int(request.query.get("count", "3"))):
            await response.write(f"data: {number}\n\n".encode())
        return response

    async def _global_events(self, request: web.Request) -> web.StreamResponse:
        if self.is_2x:
            raise web.HTTPNotFound()
        if self.events_refused:
            return web.json_response({"_tag": "UnauthorizedError"}, status=401)
        self.subscribers += 1
        queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.streams.append(queue)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"payload":{"type":"server.connected","properties":{}}}\n\n')
        try:
            while (payload := await queue.get()) is not None:
                await response.write(b"data: " + payload + b"\n\n")
        finally:
            self.streams.remove(queue)
        return response

    async def _path(self, request: web.Request) -> web.Response:
        if self.path_fails:
            raise web.HTTPServiceUnavailable()
        directory = request.query.get("directory") or self.default_directory
        return web.json_response({"home": "/root", "worktree": "/", "directory": directory})

    async def _instance_events(self, request: web.Request) -> web.StreamResponse:
        """A directory instance's `/event`: it opens with `server.connected` and stays quiet."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"type":"server.connected","properties":{}}\n\n')
        await self.release.wait()
        return response

    async def _session_events(self, request: web.Request) -> web.StreamResponse:
        """A v2 session's stream: its history, then quiet (no heartbeat, as on 1.18.33)."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for event in self.session_history.get(request.match_info["session"], []):
            await response.write(b"data: " + event + b"\n\n")
        await self.release.wait()
        return response

    def publish(self, kind: str, session_id: str, **properties: Any) -> None:
        """Send one event to every `/global/event` stream, framed as opencode frames it."""
        payload = {"type": kind, "properties": {"sessionID": session_id, **properties}}
        for queue in self.streams:
            queue.put_nowait(js_json({"directory": "/cwd", "payload": payload}))

    def drop_streams(self) -> None:
        """End every open `/global/event` stream, as a crashing server does."""
        for queue in self.streams:
            queue.put_nowait(None)

    async def _pty(self, request: web.Request) -> web.WebSocketResponse:
        socket = web.WebSocketResponse()
        await socket.prepare(request)
        async for message in socket:
            if message.type is WSMsgType.TEXT:
                await socket.send_str(f"echo:{message.data}")
            elif message.type is WSMsgType.BINARY:
                await socket.send_bytes(message.data[::-1])
        return socket

    async def _patch_part(self, request: web.Request) -> web.Response:
        part = await request.json()
        self.patches.append((request.path, part))
        path = f"/session/{request.match_info['session']}/message"
        messages = json.loads(self.bodies[path])
        for message in messages:
            message["parts"] = [part if old["id"] == part["id"] else old for old in message["parts"]]
        self.bodies[path] = js_json(messages)
        return web.json_response(part)

    async def _history(self, request: web.Request) -> web.Response:
        after = await request.json()
        if any(seq < 0 for seq in after.values()):
            return web.json_response({"_tag": "BadRequest"}, status=400)  # as opencode 1.18.33 answers
        return web.json_response([e for e in self.events if e["seq"] > after.get(e["aggregate_id"], -1)])

    async def _replay(self, request: web.Request) -> web.Response:
        self.events += self.before_replay
        self.before_replay = []
        body = await request.json()
        (event,) = body["events"]
        last = max((e["seq"] for e in self.events if e["aggregate_id"] == event["aggregateID"]), default=-1)
        self.replays.append((event["seq"], event))
        if event["seq"] != last + 1:
            return web.json_response({"name": "UnknownError"}, status=500)
        self.events.append({"aggregate_id": event["aggregateID"], **event})
        return web.json_response({"sessionID": event["aggregateID"]})

    async def _v2_session(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"data": {"id": request.match_info["session"], "location": {"directory": "/cwd"}}}
        )

    async def _body(self, request: web.Request) -> web.Response:
        body = self.bodies.get(request.path)
        if body is None and self.web_app:
            return _web_app()
        if body is None:
            raise web.HTTPNotFound()
        return web.Response(
            body=body, content_type="application/json", headers=self.headers.get(request.path)
        )
