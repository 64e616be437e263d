"""Relay a WebSocket (opencode's PTYs: `GET /pty/{id}/connect`) between client and upstream.

The upstream handshake happens first, so a refusal (401, 404) reaches the client as the
upstream's own HTTP answer. Each side answers its own pings; data frames and the close
code are relayed, and when either side goes away the other is closed.
"""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import WSCloseCode, WSMsgType, hdrs, web
from yarl import URL

from proxy.relay.errors import bad_gateway
from proxy.relay.headers import upstream_request_headers
from proxy.relay.options import RELAY, RELAY_METRICS
from proxy.relay.upstream import UPSTREAM

_HANDSHAKE_HEADERS = (
    "Sec-WebSocket-Key",
    "Sec-WebSocket-Version",
    "Sec-WebSocket-Extensions",
    "Sec-WebSocket-Protocol",
)
_PASSED_ON_REFUSAL = (hdrs.WWW_AUTHENTICATE, hdrs.CONTENT_TYPE)
_NEVER_SENT = frozenset({1005, WSCloseCode.ABNORMAL_CLOSURE, 1015})


def is_websocket_upgrade(request: web.Request) -> bool:
    """Whether the client asks to switch this request to the WebSocket protocol."""
    connection = {token.strip().lower() for token in request.headers.get(hdrs.CONNECTION, "").split(",")}
    return "upgrade" in connection and request.headers.get(hdrs.UPGRADE, "").lower() == "websocket"


async def relay_websocket(request: web.Request, url: URL) -> web.StreamResponse:
    """Open the upstream WebSocket, then accept the client's and pump frames both ways."""
    protocols = tuple(
        p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip()
    )
    headers = upstream_request_headers(request)
    for name in _HANDSHAKE_HEADERS:
        headers.popall(name, None)
    try:
        upstream = await request.app[UPSTREAM].ws_connect(
            url, headers=headers, protocols=protocols, max_msg_size=0
        )
    except aiohttp.WSServerHandshakeError as refusal:
        passed = {
            name: refusal.headers[name]
            for name in _PASSED_ON_REFUSAL
            if refusal.headers and name in refusal.headers
        }
        return web.Response(status=refusal.status, text=refusal.message, headers=passed)
    except (aiohttp.ClientConnectionError, TimeoutError) as error:
        return bad_gateway(request.app[RELAY].upstream_origin, error)
    async with upstream:
        client = web.WebSocketResponse(
            protocols=(upstream.protocol,) if upstream.protocol else (), max_msg_size=0
        )
        await client.prepare(request)
        with request.app[RELAY_METRICS].open_streams.track_inprogress():
            await _pump_both_ways(client, upstream)
        return client


async def _pump_both_ways(client: web.WebSocketResponse, upstream: aiohttp.ClientWebSocketResponse) -> None:
    async with asyncio.TaskGroup() as group:
        to_upstream = group.create_task(_pump(client, upstream))
        to_client = group.create_task(_pump(upstream, client))
        done, _ = await asyncio.wait((to_upstream, to_client), return_when=asyncio.FIRST_COMPLETED)
        for task in (to_upstream, to_client):
            if task not in done:
                task.cancel()
    # Only one side ended; closing the other is a no-op for the side that already closed.
    await client.close(code=_relayable(upstream.close_code, instead=WSCloseCode.BAD_GATEWAY))
    await upstream.close(code=_relayable(client.close_code, instead=WSCloseCode.GOING_AWAY))


def _relayable(code: int | None, *, instead: WSCloseCode) -> int:
    """The close code to pass on to the other side.

    1005, 1006 and 1015 only describe how a connection ended locally and must never be sent
    (RFC 6455 §7.4.1; browsers fail the connection on them): a side that vanished without a
    close frame is reported as `instead` (1014, bad gateway, when it was the upstream).
    """
    if code is None:
        return WSCloseCode.OK
    return instead if code in _NEVER_SENT else code


async def _pump(
    source: web.WebSocketResponse | aiohttp.ClientWebSocketResponse,
    sink: web.WebSocketResponse | aiohttp.ClientWebSocketResponse,
) -> None:
    """Copy data frames until `source` ends, or until `sink` is found gone (then the frame is
    dropped: its side has ended, and closing is left to the caller)."""
    try:
        async for message in source:
            if message.type is WSMsgType.TEXT:
                await sink.send_str(message.data)
            elif message.type is WSMsgType.BINARY:
                await sink.send_bytes(message.data)
    except ConnectionResetError:
        return
