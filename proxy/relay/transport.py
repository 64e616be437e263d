"""The upstream half of the relay: HTTP/1.1 over kept-alive connections, as Go's `http.Transport`.

The forward path asks one thing of it: send this request, give me the answer's head, then its
body piece by piece as it arrives. aiohttp's `ClientSession` does that with a request object, a
response object, a connector, trace hooks and timers per request, which measured two thirds of
the proxy's time on a small answer. Here the head goes out as one write on a kept connection
(`relay/connection.py`), and the answer comes back as the parser yields it (`relay/answers.py`).

What it keeps from `ClientSession`: connections reused while the upstream keeps them alive and
closed once idle too long (as its connector's keep-alive timeout and Go's `IdleConnTimeout` do:
opencode 1.18.33 never closes an idle connection itself, so a burst of a web UI's parallel
requests would otherwise hold its connections for good), one retry of an idempotent request
without a body when a reused connection turns out closed (the upstream dropped it while idle), a
body that ends early reported as an error, never as the end.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator

from aiohttp import hdrs
from multidict import CIMultiDict
from yarl import URL

from proxy.relay.answers import UpstreamDisconnected, UpstreamError, UpstreamResponse
from proxy.relay.connection import Connection

IDLE_SECONDS = 15.0
"""How long a connection is kept idle before it is closed (aiohttp's keep-alive timeout)."""
MOST_IDLE = 64
"""Idle connections kept at most; more are closed once their answer is done."""
_RETRIABLE = frozenset((hdrs.METH_GET, hdrs.METH_HEAD, hdrs.METH_OPTIONS, hdrs.METH_PUT, hdrs.METH_DELETE))


class Transport:
    """Requests to one upstream origin, over the connections it keeps alive."""

    def __init__(self, origin: URL, connect_timeout: float, idle_timeout: float = IDLE_SECONDS) -> None:
        self._host, self._port = origin.raw_host or "127.0.0.1", origin.port or 80
        self._authority = origin.raw_authority
        self._ssl = ssl.create_default_context() if origin.scheme == "https" else None
        self._connect_timeout = connect_timeout
        self._idle_timeout = idle_timeout
        self._idle: list[Connection] = []
        """Oldest first: a connection goes in at the end when its answer is done."""
        self._open: set[Connection] = set()
        self._sweep: asyncio.TimerHandle | None = None

    async def request(
        self,
        method: str,
        target: str,
        headers: CIMultiDict[str],
        body: AsyncIterator[bytes] | None = None,
        *,
        chunked: bool = False,
    ) -> UpstreamResponse:
        """Send `method target` with `headers` (and `body`, framed as `chunked` or by its
        `Content-Length`), and return once the answer's head has come."""
        head = _head(method, target, headers, self._authority, chunked)
        connection = self._take_idle()
        if connection is not None:
            try:
                return await connection.exchange(method, head, body, chunked)
            except UpstreamDisconnected:
                if body is not None or method not in _RETRIABLE or connection.answered:
                    raise
        connection = await self._connect()
        return await connection.exchange(method, head, body, chunked)

    async def close(self) -> None:
        """Close every connection, idle or in use."""
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        for connection in list(self._open):
            connection.close()
        self._idle.clear()

    def reuse(self, connection: Connection) -> None:
        if len(self._idle) < MOST_IDLE:
            self._idle.append(connection)
            if self._sweep is None:
                self._schedule_sweep()
        else:
            connection.close()

    def forget(self, connection: Connection) -> None:
        self._open.discard(connection)
        if connection in self._idle:
            self._idle.remove(connection)

    def _take_idle(self) -> Connection | None:
        now = time.monotonic()
        while self._idle:
            connection = self._idle.pop()
            if now - connection.idle_since < self._idle_timeout:
                return connection
            connection.close()
        return None

    def _schedule_sweep(self) -> None:
        expires_in = self._idle[0].idle_since + self._idle_timeout - time.monotonic()
        self._sweep = asyncio.get_running_loop().call_later(max(expires_in, 0.0), self._close_expired)

    def _close_expired(self) -> None:
        """Close the connections idle past the timeout, and wake again when the next one will be."""
        self._sweep = None
        expired = time.monotonic() - self._idle_timeout
        while self._idle and self._idle[0].idle_since <= expired:
            self._idle.pop(0).close()
        if self._idle:
            self._schedule_sweep()

    async def _connect(self) -> Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, connection = await loop.create_connection(
                    lambda: Connection(self), self._host, self._port, ssl=self._ssl
                )
        except TimeoutError as error:
            raise UpstreamError(f"Connection timeout to host {self._host}:{self._port}") from error
        except OSError as error:
            reason = error.strerror or error
            raise UpstreamError(f"Cannot connect to host {self._host}:{self._port} [{reason}]") from error
        self._open.add(connection)
        return connection


def _head(method: str, target: str, headers: CIMultiDict[str], authority: str, chunked: bool) -> bytes:
    """The request line and headers, as one write; `Host` is the upstream's when the client sent
    none (an HTTP/1.0 client may not)."""
    lines = [f"{method} {target} HTTP/1.1"]
    if hdrs.HOST not in headers:
        lines.append(f"{hdrs.HOST}: {authority}")
    lines += [f"{name}: {value}" for name, value in headers.items()]
    if chunked:
        lines.append(f"{hdrs.TRANSFER_ENCODING}: chunked")
    text = "\r\n".join(lines)
    if text.count("\n") != len(lines) - 1 or text.count("\r") != len(lines) - 1:
        raise ValueError("a request line or header holds a line break")
    return (text + "\r\n\r\n").encode("utf-8", "surrogateescape")
