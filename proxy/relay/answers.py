"""What the upstream answered, as the relay reads it: the head, the body as it arrives, and how
an answer can fail. Built by `relay/connection.py`; read by `relay/forward.py` and `relay/sse.py`
as they read aiohttp's `ClientResponse` before."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from types import TracebackType
from typing import Protocol

from aiohttp import hdrs
from multidict import CIMultiDict, CIMultiDictProxy

READ_BUFFER = 2**18
"""Bytes of body held per connection before its socket is paused until the relay reads them."""


class UpstreamError(Exception):
    """The upstream could not be reached, or did not answer in HTTP."""


class NotHttp(UpstreamError):
    """What came back does not begin as an HTTP answer (an SSH or a database port): its bytes
    are never repeated, in an answer or in the log."""


class UpstreamDisconnected(UpstreamError):
    """The connection closed before the answer's head came."""


class IncompleteBody(UpstreamError):
    """The connection closed, or the bytes stopped being HTTP, before the body's end."""


class Pausable(Protocol):
    """Where a body's bytes come from: paused while too much is held, resumed once it is read."""

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


class Body:
    """The body of one answer, as the parser yields it."""

    def __init__(self, socket: Pausable) -> None:
        self._socket = socket
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
            self._socket.resume_reading()
        return piece

    def feed(self, piece: bytes) -> None:
        self._pieces.append(piece)
        self._held += len(piece)
        self._wake()

    def throttle(self) -> None:
        """Pause the socket while more than `READ_BUFFER` is held and more is to come; called once
        what arrived was parsed, so a body that came whole (most do) pauses nothing (a pause and
        its resume cost two system calls)."""
        if self._held > READ_BUFFER and not self._paused and not self._ended and self._error is None:
            self._paused = True
            self._socket.pause_reading()

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

    def __init__(
        self, release: Callable[[], None], body: Body, status: int, reason: str, headers: CIMultiDict[str]
    ) -> None:
        self._release = release
        self.status = status
        self.reason = reason
        self.headers = CIMultiDictProxy(headers)
        self.content = body
        length = headers.get(hdrs.CONTENT_LENGTH)
        self.content_length = int(length) if length is not None and length.isdigit() else None
        self.content_type = headers.get(hdrs.CONTENT_TYPE, "").partition(";")[0].strip().lower()

    async def __aenter__(self) -> UpstreamResponse:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._release()
