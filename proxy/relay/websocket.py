"""Relay a WebSocket (opencode's PTYs: `GET /pty/{id}/connect`) between client and upstream.

The upstream handshake happens first, so a refusal (401, 404) reaches the client as the
upstream's own HTTP answer. Each side answers its own pings; data frames are relayed, and the
first side to close has its close, code and reason, relayed to the other before either is torn
down (a PTY's `4001 session expired` is what its client shows). The relay runs in a task of its
own: a client that sends its close and drops its connection at once gets its handler
cancelled (under the command line's handler cancellation), and that must not cut the close
short on its way to the server.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import WSCloseCode, WSMsgType, hdrs, web
from yarl import URL

from proxy.relay.errors import bad_gateway
from proxy.relay.headers import upstream_request_headers
from proxy.relay.options import RelayMetrics

_HANDSHAKE_HEADERS = (
    "Sec-WebSocket-Key",
    "Sec-WebSocket-Version",
    "Sec-WebSocket-Extensions",
    "Sec-WebSocket-Protocol",
)
_PASSED_ON_REFUSAL = (hdrs.WWW_AUTHENTICATE, hdrs.CONTENT_TYPE)
_NEVER_SENT = frozenset({1005, WSCloseCode.ABNORMAL_CLOSURE, 1015})
_ENDS = frozenset({WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR})


def is_websocket_upgrade(request: web.Request) -> bool:
    """Whether the client asks to switch this request to the WebSocket protocol."""
    connection = {token.strip().lower() for token in request.headers.get(hdrs.CONNECTION, "").split(",")}
    return "upgrade" in connection and request.headers.get(hdrs.UPGRADE, "").lower() == "websocket"


async def relay_websocket(
    request: web.Request, url: URL, session: aiohttp.ClientSession, metrics: RelayMetrics
) -> web.StreamResponse:
    """Open the upstream WebSocket through `session`, then accept the client's and pump frames
    both ways."""
    protocols = tuple(
        p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip()
    )
    headers = upstream_request_headers(request)
    for name in _HANDSHAKE_HEADERS:
        headers.popall(name, None)
    try:
        upstream = await session.ws_connect(
            url, headers=headers, protocols=protocols, max_msg_size=0, autoclose=False
        )
    except aiohttp.WSServerHandshakeError as refusal:
        passed = {
            name: refusal.headers[name]
            for name in _PASSED_ON_REFUSAL
            if refusal.headers and name in refusal.headers
        }
        return web.Response(status=refusal.status, text=refusal.message, headers=passed)
    except (aiohttp.ClientConnectionError, TimeoutError) as error:
        return bad_gateway(url.origin(), error)
    async with upstream:
        client = web.WebSocketResponse(
            protocols=(upstream.protocol,) if upstream.protocol else (), max_msg_size=0, autoclose=False
        )
        await client.prepare(request)
        with metrics.open_streams.track_inprogress():
            await _to_the_end(request, _relay(client, upstream))
        return client


async def _to_the_end(request: web.Request, relay: Coroutine[Any, Any, None]) -> None:
    """Run `relay` to its end even if the handler is cancelled because the client's connection
    was lost (it then ends by itself, bounded by the close handshake's timeout); cancelled for
    any other reason, with the client still connected, the relay is cancelled too."""
    task = asyncio.ensure_future(relay)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        if request.transport is not None:
            task.cancel()
        await asyncio.wait((task,))
        raise


@dataclass(frozen=True, slots=True)
class _Ended:
    """The side that ended first, and its last message (None: it was found gone on a send)."""

    side: web.WebSocketResponse | aiohttp.ClientWebSocketResponse
    message: aiohttp.WSMessage | None


async def _relay(client: web.WebSocketResponse, upstream: aiohttp.ClientWebSocketResponse) -> None:
    async with asyncio.TaskGroup() as group:
        pumps = (group.create_task(_pump(client, upstream)), group.create_task(_pump(upstream, client)))
        done, running = await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for task in running:
            task.cancel()
    for task in done:
        ended = task.result()
        other: web.WebSocketResponse | aiohttp.ClientWebSocketResponse = (
            upstream if ended.side is client else client
        )
        instead = WSCloseCode.BAD_GATEWAY if ended.side is upstream else WSCloseCode.GOING_AWAY
        code, reason = _close_of(ended)
        # The other side is told first; the closing side's own close is answered with its code.
        await other.close(code=_relayable(code, instead=instead), message=reason)
        await ended.side.close(code=_relayable(code, instead=instead))


def _close_of(ended: _Ended) -> tuple[int | None, bytes]:
    """The close code and reason the side that ended sent; the code of its failure (a protocol
    error, a message too big); or 1006 when it vanished without a close frame."""
    if ended.message is not None and ended.message.type is WSMsgType.CLOSE:
        return ended.message.data, str(ended.message.extra or "").encode()
    if ended.message is not None and ended.message.type is WSMsgType.ERROR:
        return ended.side.close_code, b""
    return WSCloseCode.ABNORMAL_CLOSURE, b""


def _relayable(code: int | None, *, instead: WSCloseCode) -> int:
    """The close code to pass on to the other side.

    1005, 1006 and 1015 only describe how a connection ended locally and must never be sent
    (RFC 6455 §7.4.1; browsers fail the connection on them): a side that vanished without a
    close frame is reported as `instead` (1014, bad gateway, when it was the upstream). A close
    frame without a code (aiohttp reads it as 0) is passed on as a normal closure.
    """
    if not code:
        return WSCloseCode.OK
    return instead if code in _NEVER_SENT else code


async def _pump(
    source: web.WebSocketResponse | aiohttp.ClientWebSocketResponse,
    sink: web.WebSocketResponse | aiohttp.ClientWebSocketResponse,
) -> _Ended:
    """Copy data frames until `source` closes (or fails), or until `sink` is found gone (then
    the frame is dropped: its side has ended). Closing either is left to the caller."""
    try:
        while True:
            message = await source.receive()
            if message.type is WSMsgType.TEXT:
                await sink.send_str(message.data)
            elif message.type is WSMsgType.BINARY:
                await sink.send_bytes(message.data)
            elif message.type in _ENDS:
                return _Ended(source, message)
    except ConnectionResetError:
        return _Ended(sink, None)
