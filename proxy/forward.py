"""Forward one HTTP request upstream and stream the answer back.

Bodies flow through in both directions as they arrive: event streams reach the client
event by event, downloads never sit in memory. Only a flow an addon asked to read is
buffered, and then its framing headers are rebuilt to match what is really sent.
"""

from __future__ import annotations

import aiohttp
from aiohttp import hdrs, web
from yarl import URL

from proxy.addons import Addon, Flow
from proxy.errors import bad_gateway
from proxy.headers import client_response_headers, upstream_request_headers
from proxy.upstream import SETTINGS, UPSTREAM
from proxy.websocket import is_websocket_upgrade, relay_websocket

ADDONS = web.AppKey("addons", list[Addon])


def upstream_url(request: web.Request) -> URL:
    """The upstream URL for `request`: same path and query, byte for byte."""
    return URL(str(request.app[SETTINGS].upstream_origin) + request.raw_path, encoded=True)


async def forward(request: web.Request) -> web.StreamResponse:
    """The catch-all handler: every method, every path."""
    if is_websocket_upgrade(request):
        return await relay_websocket(request, upstream_url(request))
    addons = request.app[ADDONS]
    flow = Flow(request, upstream_request_headers(request))
    for addon in addons:
        await addon.request_headers(flow)
    try:
        upstream = await request.app[UPSTREAM].request(
            request.method,
            upstream_url(request),
            headers=flow.upstream_headers,
            data=request.content if request.body_exists else None,
            allow_redirects=False,
        )
    except (aiohttp.ClientConnectionError, TimeoutError) as error:
        return bad_gateway(request.app[SETTINGS].upstream_origin, error)
    async with upstream:
        flow.status = upstream.status
        flow.response_headers = client_response_headers(upstream.headers)
        for addon in addons:
            await addon.response_headers(flow)
        if flow.read_body:
            return await _answer_whole(flow, upstream, addons)
        return await _stream(request, flow, upstream)


async def _answer_whole(flow: Flow, upstream: aiohttp.ClientResponse, addons: list[Addon]) -> web.Response:
    flow.body = await upstream.read()
    for addon in addons:
        await addon.response(flow)
    return web.Response(
        status=flow.status, reason=upstream.reason, headers=flow.response_headers, body=flow.body
    )


async def _stream(request: web.Request, flow: Flow, upstream: aiohttp.ClientResponse) -> web.StreamResponse:
    response = web.StreamResponse(status=flow.status, reason=upstream.reason, headers=flow.response_headers)
    if upstream.content_length is not None and hdrs.TRANSFER_ENCODING not in upstream.headers:
        response.content_length = upstream.content_length
    await response.prepare(request)
    async for chunk in upstream.content.iter_any():
        await response.write(chunk)
    await response.write_eof()
    return response
