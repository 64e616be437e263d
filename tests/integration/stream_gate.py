"""A plain HTTP forwarder in front of the proxy, in the test's own event loop, that holds a client's
event streams at a gate: how a test makes a page's stream come back at the moment it chooses
instead of whenever the page's own back-off lets it.

Every request is forwarded as it came (bodies unread, not decoded); a `GET /global/event` or
`/event` waits while the gate is closed, then goes on.
"""

from __future__ import annotations

import asyncio
import time
from types import TracebackType

import aiohttp
from aiohttp import web

from .http_client import free_port

_HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "host"})
_STREAMS = ("/global/event", "/event")


class StreamGate:
    """Forwards to `target`; `close()` holds event streams that open from then on, `open()` lets them go."""

    def __init__(self, target: str) -> None:
        self._target = target.rstrip("/")
        self._open = asyncio.Event()
        self._open.set()
        self.held = 0
        """Event streams waiting at the gate now."""
        self.said: list[str] = []
        """What happened to each event stream, for failure messages."""
        self._port = free_port()
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    def close(self) -> None:
        self._open.clear()

    def open(self) -> None:
        self._open.set()

    async def __aenter__(self) -> StreamGate:
        self._session = aiohttp.ClientSession(
            auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None)
        )
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self._port).start()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        stream = request.method == "GET" and request.path in _STREAMS
        if stream and not self._open.is_set():
            self.held += 1
            self._say(f"held {request.path}")
            try:
                await self._open.wait()
            finally:
                self.held -= 1
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        body = await request.read()
        async with self._session.request(
            request.method,
            self._target + request.path_qs,
            headers=headers,
            data=body or None,
            allow_redirects=False,
        ) as upstream:
            response = web.StreamResponse(
                status=upstream.status,
                headers={k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_BY_HOP},
            )
            await response.prepare(request)
            if stream:
                self._say(f"forwarded {request.path}: {upstream.status}")
            try:
                async for piece in upstream.content.iter_any():
                    await response.write(piece)
                await response.write_eof()
            except (aiohttp.ClientError, ConnectionResetError) as error:
                if stream:
                    self._say(f"cut {request.path}: {error!r}")
                if request.transport is not None:
                    request.transport.close()  # cut as the upstream's was, so the client reconnects
            return response

    def _say(self, what: str) -> None:
        self.said.append(f"{time.strftime('%H:%M:%S')} {what}")
