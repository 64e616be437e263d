"""The upstream half of the relay: HTTP/1.1 over kept-alive connections, as Go's `http.Transport`.

The forward path asks one thing of it: send this request, give me the answer's head, then its
body piece by piece as it arrives. aiohttp's `ClientSession` does that with a request object, a
response object, a connector, trace hooks and timers per request, which measured two thirds of
the proxy's time on a small answer. Here a connection is an `asyncio.Protocol` fed to
`httptools`' (llhttp) response parser, the head goes out as one write, and the body is handed
on as the parser yields it, bounded in memory by pausing the socket.

What it keeps from `ClientSession`: connections reused while the upstream keeps them alive, one
retry of an idempotent request without a body when a reused connection turns out closed (the
upstream dropped it while idle), a body that ends early reported as an error, never as the end.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator
from types import TracebackType
from typing import cast

import httptools
from aiohttp import hdrs
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

READ_BUFFER = 2**18
"""Bytes of body held per connection before its socket is paused until the relay reads them."""
IDLE_SECONDS = 15.0
"""How long an idle connection is trusted to be open: the upstream (Bun) closes its own after 10 s."""
MOST_IDLE = 64
"""Idle connections kept at most; more are closed once their answer is done."""
MAX_FIELD = 8190
"""The longest header line taken from the upstream, in bytes (aiohttp's and nginx's limit)."""
MAX_HEAD = 2**18
"""The most bytes of a head, however many lines: a head that never ends must not grow us."""
_RETRIABLE = frozenset((hdrs.METH_GET, hdrs.METH_HEAD, hdrs.METH_OPTIONS, hdrs.METH_PUT, hdrs.METH_DELETE))


class UpstreamError(Exception):
    """The upstream could not be reached, or did not answer in HTTP."""


class UpstreamDisconnected(UpstreamError):
    """The connection closed before the answer's head came."""


class IncompleteBody(UpstreamError):
    """The connection closed, or the bytes stopped being HTTP, before the body's end."""


class Body:
    """The body of one answer, as the parser yields it."""

    def __init__(self, connection: _Connection) -> None:
        self._connection = connection
        self._pieces: deque[bytes] = deque()
        self._held = 0
        self._paused = False
        self._ended = False
        self._error: UpstreamError | None = None
        self._waiter: asyncio.Future[None] | None = None

    def at_eof(self) -> bool:
        """Whether every piece has been read and the body has ended."""
        return self._ended and not self._pieces

    @property
    def held(self) -> int:
        """Bytes arrived and not read yet."""
        return self._held

    @property
    def paused(self) -> bool:
        """Whether the socket is paused until the relay reads what is held."""
        return self._paused

    async def readany(self) -> bytes:
        """What has arrived since the last read, waiting for something; b"" at the end."""
        while not self._pieces:
            if self._error is not None:
                raise self._error
            if self._ended:
                return b""
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        pieces = self._pieces
        piece = pieces.popleft() if len(pieces) == 1 else b"".join(pieces)
        pieces.clear()
        self._held = 0
        if self._paused:
            self._paused = False
            self._connection.resume_reading()
        return piece

    def feed(self, piece: bytes) -> None:
        self._pieces.append(piece)
        self._held += len(piece)
        if self._held > READ_BUFFER and not self._paused:
            self._paused = True
            self._connection.pause_reading()
        self._wake()

    def end(self, error: UpstreamError | None = None) -> None:
        if not self._ended and self._error is None:
            self._ended, self._error = error is None, error
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


class UpstreamResponse:
    """The upstream's answer: its head, and its body to read (`content`). Leaving the `async with`
    hands the connection back for reuse when the body was read to its end, else closes it."""

    def __init__(self, connection: _Connection, status: int, reason: str, headers: CIMultiDict[str]) -> None:
        self._connection = connection
        self.status = status
        self.reason = reason
        self.headers = CIMultiDictProxy(headers)
        self.content = connection.body
        length = headers.get(hdrs.CONTENT_LENGTH)
        self.content_length = int(length) if length is not None and length.isdigit() else None
        self.content_type = headers.get(hdrs.CONTENT_TYPE, "").partition(";")[0].strip().lower()

    async def __aenter__(self) -> UpstreamResponse:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._connection.release()


class Transport:
    """Requests to one upstream origin, over the connections it keeps alive."""

    def __init__(self, origin: URL, connect_timeout: float) -> None:
        self._host, self._port = origin.raw_host or "127.0.0.1", origin.port or 80
        self._authority = origin.raw_authority
        self._ssl = ssl.create_default_context() if origin.scheme == "https" else None
        self._connect_timeout = connect_timeout
        self._idle: list[_Connection] = []
        self._open: set[_Connection] = set()

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
        for connection in list(self._open):
            connection.close()
        self._idle.clear()

    def reuse(self, connection: _Connection) -> None:
        if len(self._idle) < MOST_IDLE:
            self._idle.append(connection)
        else:
            connection.close()

    def forget(self, connection: _Connection) -> None:
        self._open.discard(connection)
        if connection in self._idle:
            self._idle.remove(connection)

    def _take_idle(self) -> _Connection | None:
        now = time.monotonic()
        while self._idle:
            connection = self._idle.pop()
            if now - connection.idle_since < IDLE_SECONDS:
                return connection
            connection.close()
        return None

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, connection = await loop.create_connection(
                    lambda: _Connection(self), self._host, self._port, ssl=self._ssl
                )
        except TimeoutError as error:
            raise UpstreamError(f"Connection timeout to host {self._host}:{self._port}") from error
        except OSError as error:
            reason = error.strerror or error
            raise UpstreamError(f"Cannot connect to host {self._host}:{self._port} [{reason}]") from error
        self._open.add(connection)
        return connection


class _Connection(asyncio.Protocol):
    """One connection to the upstream, one exchange at a time."""

    def __init__(self, transport: Transport) -> None:
        self._owner = transport
        self._parser = httptools.HttpResponseParser(self)
        self._socket: asyncio.Transport | None = None
        self._head: asyncio.Future[UpstreamResponse] | None = None
        self._headers: list[tuple[bytes, bytes]] = []
        self._reason = b""
        self._until_close = False
        self._complete = False
        self._keep_alive = False
        self._method = ""
        self._head_bytes = self._header_bytes = 0
        self._sending: asyncio.Task[None] | None = None
        self._drained: asyncio.Future[None] | None = None
        self.body = Body(self)
        self.answered = False
        """Whether any byte of an answer came during the current exchange."""
        self.idle_since = 0.0

    async def exchange(
        self, method: str, head: bytes, body: AsyncIterator[bytes] | None, chunked: bool
    ) -> UpstreamResponse:
        socket = self._socket
        if socket is None or socket.is_closing():
            raise UpstreamDisconnected("Server disconnected")
        self._head = asyncio.get_running_loop().create_future()
        self._headers, self._reason, self._complete, self.answered = [], b"", False, False
        self._head_bytes = self._header_bytes = 0
        self.body, self._method = Body(self), method
        socket.write(head)
        if body is not None:
            self._sending = asyncio.create_task(self._send(body, chunked))
        try:
            return await self._head
        except BaseException:
            self.close()
            raise

    def release(self) -> None:
        """The relay is done with the answer: reuse the connection if it can carry another."""
        sending, self._sending = self._sending, None
        if sending is not None and not sending.done():
            sending.cancel()
            self._keep_alive = False
        if self._complete and self._keep_alive and self._socket is not None and not self._socket.is_closing():
            self.idle_since = time.monotonic()
            self._owner.reuse(self)
        else:
            self.close()

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()

    def pause_reading(self) -> None:
        if self._socket is not None:
            self._socket.pause_reading()

    def resume_reading(self) -> None:
        if self._socket is not None and not self._socket.is_closing():
            self._socket.resume_reading()

    async def _send(self, body: AsyncIterator[bytes], chunked: bool) -> None:
        """The request's body, as the client sends it; a body the client stops sending midway
        closes the connection, so the upstream never takes a part of it for the whole."""
        try:
            async for piece in body:
                if self._socket is None:
                    return
                if piece:
                    self._socket.write(b"%x\r\n%b\r\n" % (len(piece), piece) if chunked else piece)
                if self._drained is not None:
                    await self._drained
            if chunked and self._socket is not None:
                self._socket.write(b"0\r\n\r\n")
        except Exception:  # whatever ended the client's body ends this request
            self.close()

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._socket = cast(asyncio.Transport, transport)  # uvloop's is one, though not a subclass

    def data_received(self, data: bytes) -> None:
        self.answered = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as error:
            self._fail(f"Bad HTTP from upstream: {error}")
        except UpstreamError as error:
            self._fail(str(error))
        if self._head is not None and not self._head.done():
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD:
                self._fail(f"Got more than {MAX_HEAD} bytes of head")

    def connection_lost(self, exc: Exception | None) -> None:
        self._owner.forget(self)
        self._socket = None
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        if self._head is not None and not self._head.done():
            self._head.set_exception(UpstreamDisconnected("Server disconnected"))
        elif self._until_close and not self._complete:
            self._complete = True
            self.body.end()
        else:
            self.body.end(IncompleteBody("Response payload is not completed"))

    def pause_writing(self) -> None:
        self._drained = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        self._drained = None

    # httptools callbacks

    def on_status(self, reason: bytes) -> None:
        self._reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        size = len(name) + len(value)
        if size > MAX_FIELD:
            raise UpstreamError(f"Got more than {MAX_FIELD} bytes in a header line: {name[:40]!r}")
        self._header_bytes += size
        if self._header_bytes > MAX_HEAD:
            raise UpstreamError(f"Got more than {MAX_HEAD} bytes of headers")
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if status < 200:
            self._headers, self._reason = [], b""
            return
        if self._head is None or self._head.done():
            self.close()  # an answer nobody asked for: the connection's state is unknown
            return
        headers = CIMultiDict(
            (name.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape"))
            for name, value in self._headers
        )
        self._keep_alive = self._parser.should_keep_alive() and self._method != hdrs.METH_HEAD
        self._until_close = (
            hdrs.CONTENT_LENGTH not in headers
            and "chunked" not in headers.get(hdrs.TRANSFER_ENCODING, "").lower()
            and status not in (204, 304)
        )
        response = UpstreamResponse(self, status, self._reason.decode("utf-8", "surrogateescape"), headers)
        if self._method == hdrs.METH_HEAD:
            self._end_message()
        self._head.set_result(response)

    def on_body(self, piece: bytes) -> None:
        self.body.feed(piece)

    def on_message_complete(self) -> None:
        if self._parser.get_status_code() >= 200:
            self._end_message()

    def _end_message(self) -> None:
        if not self._complete:
            self._complete = True
            self.body.end()

    def _fail(self, reason: str) -> None:
        """The bytes stopped being an answer the relay can pass on: fail the exchange, drop the
        connection."""
        if self._head is not None and not self._head.done():
            self._head.set_exception(UpstreamError(reason))
        else:
            self.body.end(IncompleteBody(reason))
        self.close()


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
