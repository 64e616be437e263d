"""One kept-alive HTTP/1.1 connection to the upstream, one exchange at a time.

The answer's bytes go to `httptools`' response parser (llhttp, Node's own); its callbacks build
the head, hand the body on piece by piece (`answers.Body`) and say when the message ends, which
is when the connection may carry another. The upstream's head is bounded (a line, the whole), so
a server gone wrong cannot grow the proxy; whatever is not HTTP fails the exchange, never the
proxy.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Protocol, cast

import httptools
from aiohttp import hdrs
from multidict import CIMultiDict

from proxy.relay.answers import (
    Body,
    IncompleteBody,
    NotHttp,
    UpstreamDisconnected,
    UpstreamError,
    UpstreamResponse,
)

MAX_FIELD = 8190
"""The longest header line taken from the upstream, in bytes (aiohttp's and nginx's limit)."""
MAX_HEAD = 2**18
"""The most bytes of a head, however many lines: a head that never ends must not grow us."""


class Pool(Protocol):
    """Who keeps the connections: told when one may carry another request, and when one is gone."""

    def reuse(self, connection: Connection) -> None: ...

    def forget(self, connection: Connection) -> None: ...


class Connection(asyncio.Protocol):
    """One connection to the upstream, one exchange at a time."""

    def __init__(self, pool: Pool) -> None:
        self._owner = pool
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
        self._unasked: UpstreamError | None = None
        """What failed before any exchange: the bytes of a server that speaks first."""
        self.body = Body(self)
        self.answered = False
        """Whether any byte of an answer came during the current exchange."""
        self.idle_since = 0.0

    async def exchange(
        self, method: str, head: bytes, body: AsyncIterator[bytes] | None, chunked: bool
    ) -> UpstreamResponse:
        socket = self._socket
        if self._unasked is not None:  # it spoke first, and not HTTP (an SSH server's banner)
            raise self._unasked
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
        """The relay is done with the answer: reuse the connection if it can carry another, which
        it can only once its body was read to the end (one left unread may hold the socket paused)."""
        sending, self._sending = self._sending, None
        if sending is not None and not sending.done():
            sending.cancel()
            self._keep_alive = False
        socket = self._socket
        if (
            self._keep_alive
            and self._complete
            and self.body.at_eof()
            and socket is not None
            and not socket.is_closing()
        ):
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
            if self._head_bytes == 0 and not data.startswith(b"HTTP/"):
                self._fail("its first bytes are not an HTTP answer", NotHttp)
            else:
                self._fail(f"Bad HTTP from upstream: {error}")
        except UpstreamError as error:
            self._fail(str(error))
        self.body.throttle()
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
        response = UpstreamResponse(
            self.release, self.body, status, self._reason.decode("utf-8", "surrogateescape"), headers
        )
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

    def _fail(self, reason: str, kind: type[UpstreamError] = UpstreamError) -> None:
        """The bytes stopped being an answer the relay can pass on: fail the exchange, drop the
        connection."""
        if self._head is None:
            self._unasked = kind(reason)
        elif not self._head.done():
            self._head.set_exception(kind(reason))
        else:
            self.body.end(IncompleteBody(reason))
        self.close()
