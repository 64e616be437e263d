"""A WebSocket's close reaches the other side whole, code and reason, whichever side closes and
however fast the closing side then drops its connection (the proxy's handler is cancelled then,
as the command line runs it; the close must be relayed first)."""

from __future__ import annotations

import asyncio
import base64
import os
import struct
from collections.abc import Awaitable, Callable

from aiohttp import WSCloseCode, WSMsgType, web
from aiohttp.test_utils import TestServer
from yarl import URL

from proxy.service.app import create_app
from proxy.service.config import Settings
from proxy.testing import WAIT_S
from tests.proxy.conftest import ProxyClient


class PtyUpstream:
    """`/pty/expire/connect` closes with 4001 'session expired' once the client said "go";
    `/pty/listen/connect` keeps what the client sent, and how it closed, in `heard`."""

    def __init__(self) -> None:
        self.heard: list[tuple[WSMsgType, object, object]] = []
        self.closed = asyncio.Event()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/pty/expire/connect", self._expire)
        app.router.add_get("/pty/listen/connect", self._listen)
        app.router.add_get("/pty/vanish/connect", self._vanish)
        return app

    async def _vanish(self, request: web.Request) -> web.WebSocketResponse:
        socket = web.WebSocketResponse()
        await socket.prepare(request)
        assert (await socket.receive_str()) == "go"
        assert request.transport is not None
        request.transport.abort()
        return socket

    async def _expire(self, request: web.Request) -> web.WebSocketResponse:
        socket = web.WebSocketResponse()
        await socket.prepare(request)
        assert (await socket.receive_str()) == "go"
        await socket.close(code=4001, message=b"session expired")
        return socket

    async def _listen(self, request: web.Request) -> web.WebSocketResponse:
        socket = web.WebSocketResponse(autoclose=False)
        await socket.prepare(request)
        while True:
            message = await socket.receive()
            self.heard.append((message.type, message.data, message.extra))
            if message.type in (WSMsgType.CLOSE, WSMsgType.CLOSED, WSMsgType.ERROR):
                break
        self.closed.set()
        await socket.close()
        return socket


async def _proxy(
    pty: PtyUpstream,
    aiohttp_server: Callable[[web.Application], Awaitable[TestServer]],
    aiohttp_client: Callable[[web.Application], Awaitable[ProxyClient]],
) -> ProxyClient:
    upstream = await aiohttp_server(pty.app())
    return await aiohttp_client(create_app(Settings(upstream=URL(str(upstream.make_url("/"))))))


async def test_the_servers_close_reaches_the_client_with_its_reason(aiohttp_server, aiohttp_client) -> None:  # type: ignore[no-untyped-def]
    proxy = await _proxy(PtyUpstream(), aiohttp_server, aiohttp_client)
    async with proxy.ws_connect("/pty/expire/connect") as socket:
        await socket.send_str("go")
        message = await asyncio.wait_for(socket.receive(), WAIT_S)
    assert (message.type, message.data, message.extra) == (WSMsgType.CLOSE, 4001, "session expired")


async def test_the_clients_close_reaches_the_server_with_its_reason(aiohttp_server, aiohttp_client) -> None:  # type: ignore[no-untyped-def]
    pty = PtyUpstream()
    proxy = await _proxy(pty, aiohttp_server, aiohttp_client)
    async with proxy.ws_connect("/pty/listen/connect") as socket:
        await socket.send_str("ls")
        await socket.close(code=4002, message=b"bye")
    await asyncio.wait_for(pty.closed.wait(), WAIT_S)
    assert pty.heard == [(WSMsgType.TEXT, "ls", ""), (WSMsgType.CLOSE, 4002, "bye")]


def _masked_frame(opcode: int, payload: bytes) -> bytes:
    """One client frame (clients must mask theirs, RFC 6455 §5.3)."""
    mask = os.urandom(4)
    masked = bytes(byte ^ mask[index % 4] for index, byte in enumerate(payload))
    return bytes([0x80 | opcode, 0x80 | len(payload)]) + mask + masked


async def test_a_close_sent_just_before_the_connection_drops_reaches_the_server_whole(  # type: ignore[no-untyped-def]
    aiohttp_server, aiohttp_client
) -> None:
    """The client sends "ls" and its close frame in one write and then closes its TCP connection
    at once, without waiting for the close handshake."""
    pty = PtyUpstream()
    proxy = await _proxy(pty, aiohttp_server, aiohttp_client)
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write(
        f"GET /pty/listen/connect HTTP/1.1\r\nHost: 127.0.0.1:{proxy.port}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
    assert head.startswith(b"HTTP/1.1 101")
    writer.write(_masked_frame(0x1, b"ls") + _masked_frame(0x8, struct.pack("!H", 4002) + b"bye"))
    writer.close()
    await writer.wait_closed()
    await asyncio.wait_for(pty.closed.wait(), WAIT_S)
    assert pty.heard == [(WSMsgType.TEXT, "ls", ""), (WSMsgType.CLOSE, 4002, "bye")]


async def test_a_server_that_vanishes_is_reported_as_a_bad_gateway(aiohttp_server, aiohttp_client) -> None:  # type: ignore[no-untyped-def]
    proxy = await _proxy(PtyUpstream(), aiohttp_server, aiohttp_client)
    async with proxy.ws_connect("/pty/vanish/connect") as socket:
        await socket.send_str("go")
        message = await asyncio.wait_for(socket.receive(), WAIT_S)
    assert (message.type, message.data) == (WSMsgType.CLOSE, WSCloseCode.BAD_GATEWAY)


async def test_a_client_that_vanishes_is_reported_as_going_away(aiohttp_server, aiohttp_client) -> None:  # type: ignore[no-untyped-def]
    pty = PtyUpstream()
    proxy = await _proxy(pty, aiohttp_server, aiohttp_client)
    socket = await proxy.ws_connect("/pty/listen/connect")
    connection = socket._response.connection
    assert connection is not None
    assert connection.transport is not None
    connection.transport.abort()  # no close frame: the TCP connection is reset
    await asyncio.wait_for(pty.closed.wait(), WAIT_S)
    assert pty.heard == [(WSMsgType.CLOSE, WSCloseCode.GOING_AWAY, "")]
