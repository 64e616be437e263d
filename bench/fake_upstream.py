"""A fast fake `opencode serve` for the benchmark: every body is precomputed at start.

The upstream must cost as little as possible per request, so that the time measured through
an intermediary is the intermediary's and not the fake server's. Run with
`python -m bench.fake_upstream --port P` from the repository root.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

from bench import shapes
from bench.shapes import Api

CHUNK = 256 * 1024
DEFAULT_BLOB = 100 * 1024 * 1024
JSON = "application/json"
HEALTH = b'{"healthy":true,"version":"1.18.33"}'
"""What 1.18.33 answers on `/global/health`: the proxy learns from it which server it fronts, and
follows the events, writes and settles only for one it knows."""
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Upstream:
    """The routes of the fake server, over bodies built once."""

    def __init__(self, fixtures: Path, tool_counts: list[int]) -> None:
        cases = shapes.message_cases(tool_counts)
        v1, v2 = shapes.V1Builder(fixtures), shapes.V2Builder(fixtures)
        self.config = shapes.config_body()
        self.messages = {(c.api, c.session_id): (v1 if c.api is Api.V1 else v2).body(c) for c in cases}
        self.v1_info = {c.session_id: v1.info(c) for c in cases if c.api is Api.V1}
        self.v2_active = shapes.v2_active_body(cases)
        self.v1_status = shapes.v1_status_body(cases)
        self.event_head, self.event_tail = shapes.event_template(fixtures)
        self.chunk = bytes(range(256)) * (CHUNK // 256)
        self.sizes = {c.name: len(self.messages[c.api, c.session_id]) for c in cases}

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get(shapes.CONFIG_PATH, self._fixed(lambda: self.config))
        app.router.add_get("/global/health", self._fixed(lambda: HEALTH))
        app.router.add_get("/api/session/active", self._fixed(lambda: self.v2_active))
        app.router.add_get("/api/session/{sid}/message", self._message(Api.V2))
        app.router.add_get("/session/status", self.status)
        app.router.add_get("/session/{sid}", self.session_info)
        app.router.add_get("/session/{sid}/message", self._message(Api.V1))
        app.router.add_get(shapes.EVENT_PATH, self.events)
        app.router.add_get("/global/event", self.global_events)
        app.router.add_get(shapes.BLOB_PATH, self.blob)
        return app

    @staticmethod
    def _fixed(body: Callable[[], bytes]) -> Handler:
        async def handler(_: web.Request) -> web.Response:
            return web.Response(body=body(), content_type=JSON)

        return handler

    def _message(self, api: Api) -> Handler:
        async def handler(request: web.Request) -> web.Response:
            body = self.messages.get((api, request.match_info["sid"]))
            if body is None:
                raise web.HTTPNotFound(text='{"name":"NotFoundError"}', content_type=JSON)
            return web.Response(body=body, content_type=JSON)

        return handler

    async def status(self, request: web.Request) -> web.Response:
        """Only sessions of the benchmark's one directory exist; any other directory has none busy."""
        body = self.v1_status if request.query.get("directory") == shapes.DIRECTORY else b"{}"
        return web.Response(body=body, content_type=JSON)

    async def session_info(self, request: web.Request) -> web.Response:
        body = self.v1_info.get(request.match_info["sid"])
        if body is None:
            raise web.HTTPNotFound(text='{"name":"NotFoundError"}', content_type=JSON)
        return web.Response(body=body, content_type=JSON)

    async def events(self, request: web.Request) -> web.StreamResponse:
        """`count` events at `rate`/s on an absolute schedule, each stamped just before writing."""
        rate, count = float(request.query.get("rate", "100")), int(request.query.get("count", "100"))
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        await response.write(b'data: {"type":"server.connected","properties":{}}\n\n')
        loop = asyncio.get_running_loop()
        start = loop.time()
        for seq in range(count):
            delay = start + seq / rate - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            stamp = b'{"seq":%d,"sentNs":%d}' % (seq, time.monotonic_ns())
            await response.write(self.event_head + stamp + self.event_tail)
        await response.write_eof()
        return response

    async def global_events(self, request: web.Request) -> web.StreamResponse:
        """A quiet `/global/event`, as an idle server's: the proxy follows it for its liveness."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"payload":{"type":"server.connected","properties":{}}}\n\n')
        while True:
            await asyncio.sleep(10)
            await response.write(b'data: {"payload":{"type":"server.heartbeat","properties":{}}}\n\n')

    async def blob(self, request: web.Request) -> web.StreamResponse:
        """A large streamed download with a Content-Length, like a file or an export."""
        size = int(request.query.get("bytes", str(DEFAULT_BLOB)))
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        response.content_length = size
        await response.prepare(request)
        view = memoryview(self.chunk)
        for offset in range(0, size, CHUNK):
            await response.write(view[: min(CHUNK, size - offset)])
        await response.write_eof()
        return response


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop when installed: the fake upstream should be the fastest part of every path."""
    try:
        import uvloop  # noqa: PLC0415
    except ImportError:
        return None
    return uvloop.new_event_loop


async def serve(upstream: Upstream, port: int) -> None:
    runner = web.AppRunner(upstream.app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    print(f"fake upstream on 127.0.0.1:{port}; message bodies: {upstream.sizes}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tools", default="1000,10000", help="comma-separated tool-part counts to serve")
    parser.add_argument("--fixtures", type=Path, default=shapes.FIXTURES)
    args = parser.parse_args()
    upstream = Upstream(args.fixtures, [int(n) for n in args.tools.split(",") if n])
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(serve(upstream, args.port))


if __name__ == "__main__":
    main()
