"""The forward path's transport, against an upstream scripted byte by byte."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
from multidict import CIMultiDict
from yarl import URL

from proxy.relay.answers import READ_BUFFER, IncompleteBody, UpstreamDisconnected, UpstreamError
from proxy.relay.connection import MAX_FIELD
from proxy.relay.transport import Transport
from tests.reliability.processes import eventually

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


class Upstream:
    """A loopback server running `script` on each connection, counting connections."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.connections = 0
        self.url = URL()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.script(reader, writer)
        finally:
            writer.close()


@asynccontextmanager
async def serving(script: Script) -> AsyncIterator[tuple[Upstream, Transport]]:
    upstream = Upstream(script)
    server = await asyncio.start_server(upstream._serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    upstream.url = URL(f"http://127.0.0.1:{port}")
    transport = Transport(upstream.url, connect_timeout=5.0)
    try:
        yield upstream, transport
    finally:
        await transport.close()
        server.close()
        await server.wait_closed()


async def head_of(reader: asyncio.StreamReader) -> bytes:
    return await reader.readuntil(b"\r\n\r\n")


def answering(*answers: bytes, heads: list[bytes] | None = None) -> Script:
    """Answer each request with the next of `answers`, keeping the connection open."""

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for answer in answers:
            head = await head_of(reader)
            if heads is not None:
                heads.append(head)
            writer.write(answer)
            await writer.drain()
        await reader.read()

    return script


async def whole(transport: Transport, method: str = "GET", target: str = "/") -> tuple[int, bytes]:
    async with await transport.request(method, target, CIMultiDict(Host="proxy")) as response:
        pieces = []
        while piece := await response.content.readany():
            pieces.append(piece)
        return response.status, b"".join(pieces)


async def test_requests_go_out_as_sent_and_share_one_kept_alive_connection() -> None:
    heads: list[bytes] = []
    async with serving(answering(OK, OK, heads=heads)) as (upstream, transport):
        assert await whole(transport, target="/a%2Fb?x=1") == (200, b"ok")
        assert await whole(transport) == (200, b"ok")
    assert heads[0] == b"GET /a%2Fb?x=1 HTTP/1.1\r\nHost: proxy\r\n\r\n"
    assert upstream.connections == 1


async def test_a_request_without_host_gets_the_upstreams() -> None:
    heads: list[bytes] = []
    async with (
        serving(answering(OK, heads=heads)) as (upstream, transport),
        await transport.request("GET", "/", CIMultiDict()) as response,
    ):
        assert await response.content.readany() == b"ok"
    assert heads[0] == f"GET / HTTP/1.1\r\nHost: {upstream.url.raw_authority}\r\n\r\n".encode()


async def test_a_kept_connection_the_upstream_dropped_is_retried_for_a_get_only() -> None:
    async def drops_the_second(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await head_of(reader)
        writer.write(OK)
        await writer.drain()
        await head_of(reader)  # the second request on this connection is never answered

    async with serving(drops_the_second) as (upstream, transport):
        assert await whole(transport) == (200, b"ok")
        assert await whole(transport) == (200, b"ok")
        assert upstream.connections == 2
        with pytest.raises(UpstreamDisconnected):
            await whole(transport, method="POST")


async def test_request_bodies_go_out_with_their_length_or_chunked() -> None:
    received: list[bytes] = []

    async def reads_bodies(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.append(await head_of(reader) + await reader.readexactly(6))
        writer.write(OK)
        received.append(await head_of(reader) + await reader.readuntil(b"0\r\n\r\n"))
        writer.write(OK)
        await reader.read()

    async def body() -> AsyncIterator[bytes]:
        yield b"abc"
        yield b""
        yield b"def"

    async with serving(reads_bodies) as (_, transport):
        sized = CIMultiDict({"Host": "p", "Content-Length": "6"})
        async with await transport.request("POST", "/", sized, body()) as response:
            assert await response.content.readany() == b"ok"
        async with await transport.request(
            "POST", "/", CIMultiDict(Host="p"), body(), chunked=True
        ) as response:
            assert await response.content.readany() == b"ok"
    assert received == [
        b"POST / HTTP/1.1\r\nHost: p\r\nContent-Length: 6\r\n\r\nabcdef",
        b"POST / HTTP/1.1\r\nHost: p\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n3\r\ndef\r\n0\r\n\r\n",
    ]


async def test_an_interim_answer_is_passed_over() -> None:
    async with serving(answering(b"HTTP/1.1 100 Continue\r\n\r\n" + OK)) as (_, transport):
        assert await whole(transport) == (200, b"ok")


async def test_a_head_answer_has_no_body_and_its_connection_is_not_reused() -> None:
    async def answers_head_without_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while head := await head_of(reader):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n" if head.startswith(b"HEAD") else OK)

    async with serving(answers_head_without_body) as (upstream, transport):
        async with await transport.request("HEAD", "/", CIMultiDict(Host="p")) as response:
            assert response.content_length == 5
            assert await response.content.readany() == b""
            assert response.content.at_eof()
        assert await whole(transport) == (200, b"ok")
    assert upstream.connections == 2


async def test_a_body_without_length_ends_with_the_connection() -> None:
    async def until_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await head_of(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it")

    async with serving(until_close) as (_, transport):
        assert await whole(transport) == (200, b"all of it")


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",
    ],
    ids=["short of its length", "chunked, cut"],
)
async def test_a_body_cut_short_is_an_error_never_its_end(answer: bytes) -> None:
    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await head_of(reader)
        writer.write(answer)

    async with serving(cut) as (_, transport):
        with pytest.raises(IncompleteBody):
            await whole(transport)


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * MAX_FIELD + b"\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n" + (b"X-Many: " + b"a" * 100 + b"\r\n") * 3_000 + b"\r\n",
        b"HTTP/1.1 200 OK\r\nX-Endless: " + b"a" * (2 * READ_BUFFER),
        b"not http at all\r\n\r\n",
    ],
    ids=["a long header line", "too many headers", "a header line that does not end", "not HTTP"],
)
async def test_a_head_past_the_limits_or_not_http_fails_the_request(answer: bytes) -> None:
    async with serving(answering(answer)) as (_, transport):
        with pytest.raises(UpstreamError):
            await whole(transport)


async def test_an_unread_body_pauses_the_socket_until_it_is_read() -> None:
    size = 16 * READ_BUFFER

    async def large(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await head_of(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size + b"x" * size)
        await writer.drain()
        await reader.read()

    async with (
        serving(large) as (_, transport),
        await transport.request("GET", "/", CIMultiDict(Host="p")) as response,
    ):
        body = response.content
        assert await eventually(lambda: body.paused)
        held = body.held
        assert READ_BUFFER < held < 4 * READ_BUFFER
        read = len(await body.readany())
        assert read == held
        assert not body.paused
        while piece := await body.readany():
            read += len(piece)
        assert read == size


async def test_an_unreachable_upstream_is_an_error_that_says_so() -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    transport = Transport(URL(f"http://127.0.0.1:{port}"), connect_timeout=5.0)
    with pytest.raises(UpstreamError, match="Cannot connect to host"):
        await whole(transport)


async def test_a_header_with_a_line_break_is_never_sent() -> None:
    async with serving(answering(OK)) as (upstream, transport):
        with pytest.raises(ValueError, match="line break"):
            await transport.request("GET", "/", CIMultiDict({"Host": "p", "X-A": "a\r\nX-Injected: 1"}))
    assert upstream.connections == 0


async def test_a_connection_whose_body_was_left_unread_is_never_reused() -> None:
    """A client that leaves once the whole answer has come but before it was read (wrk at the end
    of a run): the connection is closed, and the next request gets one of its own. A body that
    came whole never paused the socket."""
    size = READ_BUFFER + 1000

    answers = [b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size + b"x" * size, OK]

    async def large_then_small(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while answers:
            await head_of(reader)
            writer.write(answers.pop(0))
        await reader.read()

    async with serving(large_then_small) as (_, transport):
        async with await transport.request("GET", "/", CIMultiDict(Host="p")) as response:
            assert await eventually(lambda: response.content.held == size)
            assert response.content.at_eof() is False
            assert not response.content.paused
        assert await asyncio.wait_for(whole(transport), 5) == (200, b"ok")


async def test_connections_idle_past_the_timeout_are_closed_though_the_upstream_keeps_them() -> None:
    """opencode 1.18.33 never closes an idle connection: the transport closes its own, however
    many a burst of parallel requests opened."""
    closed: list[bool] = []

    async def keeps_it(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await answering(OK)(reader, writer)
        closed.append(True)

    async with serving(keeps_it) as (upstream, _):
        transport = Transport(upstream.url, connect_timeout=5.0, idle_timeout=0.2)
        try:
            answers = await asyncio.gather(whole(transport), whole(transport), whole(transport))
            assert list(answers) == [(200, b"ok")] * 3
            assert upstream.connections == 3
            assert await eventually(lambda: len(closed) == 3, within=5.0)
        finally:
            await transport.close()
