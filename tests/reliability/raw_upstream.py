"""A scripted HTTP/1.1 upstream on a raw socket: it sends exactly the bytes a test chooses.

aiohttp's own server normalises what it sends (framing, HEAD, 204/304 bodies, header
validation), which a test of the proxy's tolerance must not have: here status line, headers,
framing and even malformed responses are the test's. It also records every request exactly
as the proxy framed it, which is what the smuggling tests inspect.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Set
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Literal

import orjson
from yarl import URL

_HEAD_LIMIT = 2**20
Framing = Literal["length", "chunked", "close"]
Then = Literal["keep", "close", "hang"]


@dataclass(frozen=True)
class Received:
    """One request as the upstream read it off the wire; `body` is de-chunked."""

    method: str
    target: str
    headers: tuple[tuple[str, str], ...]
    body: bytes

    def header(self, name: str) -> list[str]:
        """Every value of header `name` (case-insensitive), in order."""
        return [value for key, value in self.headers if key.lower() == name.lower()]

    @property
    def path(self) -> str:
        return self.target.partition("?")[0]


@dataclass(frozen=True)
class Reply:
    """Bytes to write for one request, and what the connection does next."""

    data: bytes
    then: Then = "keep"


Responder = Callable[[Received], Awaitable[Reply]]


def response(
    status: int,
    body: bytes = b"",
    headers: Iterable[tuple[str, str]] = (),
    *,
    framing: Framing = "length",
    head: bool = False,
) -> Reply:
    """A response with the chosen framing; `head` sends the headers of that response only.

    Close-delimited bodies end the connection, as they must. Bodies of 1xx, 204 and 304 are
    never sent, and the framing header is left to `headers` for them.
    """
    lines = [f"HTTP/1.1 {status} X".encode()]
    lines += [f"{name}: {value}".encode() for name, value in headers]
    bodiless = status < 200 or status in (204, 304)
    if not bodiless and framing == "length":
        lines.append(b"Content-Length: %d" % len(body))
    elif not bodiless and framing == "chunked":
        lines.append(b"Transfer-Encoding: chunked")
    if head or bodiless:
        body_bytes = b""
    elif framing == "chunked":
        body_bytes = (b"%x\r\n%s\r\n" % (len(body), body) if body else b"") + b"0\r\n\r\n"
    else:
        body_bytes = body
    then: Then = "close" if framing == "close" and not (head or bodiless) else "keep"
    return Reply(b"\r\n".join(lines) + b"\r\n\r\n" + body_bytes, then)


def json_reply(document: object, status: int = 200) -> Reply:
    return response(status, orjson.dumps(document), [("Content-Type", "application/json")])


class RawUpstream:
    """The server: `responder` answers each request; `received` keeps them all."""

    def __init__(self, responder: Responder) -> None:
        self.responder = responder
        self.received: list[Received] = []
        self._connections: set[asyncio.Task[None]] = set()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            while (request := await _read_request(reader)) is not None:
                self.received.append(request)
                reply = await self.responder(request)
                writer.write(reply.data)
                await writer.drain()
                if reply.then == "hang":
                    await asyncio.Event().wait()
                if reply.then == "close":
                    break
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass
        finally:
            self._connections.discard(task)
            writer.close()

    async def close_connections(self) -> None:
        """Drop every open connection at once, as a killed server does."""
        tasks = list(self._connections)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@asynccontextmanager
async def raw_upstream(responder: Responder, port: int = 0) -> AsyncIterator[tuple[URL, RawUpstream]]:
    """Serve `responder` on 127.0.0.1 until the block ends; every connection is closed then."""
    upstream = RawUpstream(responder)
    server = await asyncio.start_server(upstream._serve, "127.0.0.1", port, limit=_HEAD_LIMIT)
    try:
        bound = server.sockets[0].getsockname()[1]
        yield URL(f"http://127.0.0.1:{bound}"), upstream
    finally:
        server.close()
        await upstream.close_connections()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 5)


async def _read_request(reader: asyncio.StreamReader) -> Received | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    request_line, *header_lines = head[:-4].decode("latin-1").split("\r\n")
    method, target, _ = request_line.split(" ", 2)
    headers = tuple(
        (name.strip(), value.strip()) for name, _, value in (h.partition(":") for h in header_lines)
    )
    received = Received(method, target, headers, b"")
    return Received(method, target, headers, await _read_body(reader, received))


async def _read_body(reader: asyncio.StreamReader, request: Received) -> bytes:
    if any("chunked" in value.lower() for value in request.header("Transfer-Encoding")):
        chunks = []
        while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
            chunks.append(await reader.readexactly(size))
            await reader.readexactly(2)
        while await reader.readuntil(b"\r\n") != b"\r\n":
            pass  # trailer fields
        return b"".join(chunks)
    lengths = request.header("Content-Length")
    return await reader.readexactly(int(lengths[0])) if lengths else b""


SESSION_ROUTE = re.compile(r"^/session/(?P<session>[^/]+)$")


def opencode_routes(messages: Responder, active: Set[str] = frozenset()) -> Responder:
    """Answer the liveness look-ups as opencode would, with only the sessions in `active` running
    (read at each look-up, so a test may change it), and everything else with `messages`.
    `/global/event` is refused, so the proxy keeps no readings and asks on every fetch: each
    answer is then decided afresh. `/global/health` names 1.18.33."""

    async def respond(request: Received) -> Reply:
        if request.path == "/api/session/active":
            return json_reply({"data": {session: {"type": "running"} for session in active}})
        if request.path == "/session/status":
            return json_reply({session: {"type": "busy"} for session in active})
        if found := SESSION_ROUTE.match(request.path):
            return json_reply({"id": found["session"], "directory": "/cwd"})
        if request.path == "/global/event":
            return json_reply({"name": "NotFound"}, status=404)
        if request.path == "/global/health":
            return json_reply({"healthy": True, "version": "1.18.33"})
        return await messages(request)

    return respond
