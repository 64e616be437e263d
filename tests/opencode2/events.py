"""`GET /api/event` of opencode 2.x: one SSE stream per client, fed by every event the server publishes.

`packages/server/src/handlers/event.ts` `EventHandler` `event.subscribe` @014a439e5f02: the first frame is
`{id, type: "server.connected", data: {}}`, every frame is `data: <json>\\n\\n` (no `event:` line), a
`: heartbeat\\n\\n` comment goes out every 15 s, and the answer carries `Cache-Control: no-cache,
no-transform`, `X-Accel-Buffering: no`, `X-Content-Type-Options: nosniff`. Frames are
`EventFeed.frame` (`packages/server/src/event-feed.ts` @0d49a51a044e).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import orjson
from aiohttp import web

from tests.opencode2.shapes import Json, ascending, envelope

HEARTBEAT = b": heartbeat\n\n"
HEARTBEAT_SECONDS = 15.0
"""`Stream.tick("15 seconds")` (handlers/event.ts @014a439e5f02)."""


def frame(event: Json) -> bytes:
    """`EventFeed.frame`: `data: ` + the JSON of the event + a blank line."""
    return b"data: " + orjson.dumps(event) + b"\n\n"


class EventHub:
    """The open `/api/event` streams and the durable sequence of each session's events."""

    def __init__(self, clock: Callable[[], int], heartbeat_seconds: float | None = HEARTBEAT_SECONDS) -> None:
        self._clock = clock
        self.heartbeat_seconds = heartbeat_seconds
        """None: heartbeats go out only when a test calls `heartbeat()`."""
        self._queues: dict[asyncio.Queue[bytes | None], web.Request] = {}
        self.sequences: dict[str, int] = {}
        """Each session's last durable `seq` (kept in the database, so across restarts)."""
        self.published: list[Json] = []
        """Every event published since the stand-in started, restarts included, in order."""
        self.connected = asyncio.Condition()

    @property
    def subscribers(self) -> int:
        return len(self._queues)

    def publish(self, event_type: str, data: Json, durable: bool = True) -> Json:
        """Frame `data` as 2.x does and send it to every open stream; a durable session event takes
        the session's next `durable.seq` (`schema/src/event.ts` @162a75f99cc1)."""
        seq = None
        if durable:
            seq = self.sequences.get(data["sessionID"], 0) + 1
            self.sequences[data["sessionID"]] = seq
        event = envelope(event_type, data, self._clock(), seq)
        self.published.append(event)
        for queue in self._queues:
            queue.put_nowait(frame(event))
        return event

    def heartbeat(self) -> None:
        for queue in self._queues:
            queue.put_nowait(HEARTBEAT)

    def cut(self) -> None:
        """End every stream as a killed process does: the connection drops mid-stream, no last frame."""
        for queue, request in list(self._queues.items()):
            queue.put_nowait(None)
            if request.transport is not None:
                request.transport.abort()

    async def wait_for_subscribers(self, count: int) -> None:
        """Returns once `count` streams are open (their `server.connected` is sent)."""
        async with self.connected:
            await self.connected.wait_for(lambda: self.subscribers >= count)

    async def serve(self, request: web.Request, *, compress: bool = False) -> web.StreamResponse:
        """`compress`: gzip the stream when the request accepts it (`Process.compress`)."""
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache, no-transform",
                "X-Accel-Buffering": "no",
                "X-Content-Type-Options": "nosniff",
            }
        )
        if compress and accepts_gzip(request):
            response.enable_compression(web.ContentCoding.gzip)
        await response.prepare(request)
        queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        connected = {"id": ascending("evt"), "type": "server.connected", "data": {}}
        await response.write(frame(connected))
        self._queues[queue] = request
        async with self.connected:
            self.connected.notify_all()
        try:
            await self._pump(response, queue)
        finally:
            self._queues.pop(queue, None)
        return response

    async def _pump(self, response: web.StreamResponse, queue: asyncio.Queue[bytes | None]) -> None:
        while True:
            try:
                chunk = await asyncio.wait_for(queue.get(), self.heartbeat_seconds)
            except TimeoutError:
                chunk = HEARTBEAT
            if chunk is None:
                return
            try:
                await response.write(chunk)
            except ConnectionError:
                return


def accepts_gzip(request: web.Request) -> bool:
    """Whether the request takes a gzip answer (a substring test, as 1.18.33's own is)."""
    return "gzip" in request.headers.get("Accept-Encoding", "").lower()
