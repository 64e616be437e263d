"""Forward one HTTP request upstream and stream the answer back.

Bodies flow through in both directions as they arrive: event streams reach the client
event by event, downloads never sit in memory. Only a flow an addon asked to read is
buffered, and then its framing headers are rebuilt to match what is really sent.
"""

from __future__ import annotations

import logging
import time

import aiohttp
from aiohttp import hdrs, web
from yarl import URL

from proxy.addons import Addon, Flow
from proxy.errors import bad_gateway
from proxy.headers import client_response_headers, upstream_request_headers
from proxy.metrics import METRICS
from proxy.upstream import SETTINGS, UPSTREAM, upstream_path
from proxy.websocket import is_websocket_upgrade, relay_websocket

log = logging.getLogger(__name__)

ADDONS = web.AppKey("addons", list[Addon])


def upstream_url(request: web.Request) -> URL:
    """The upstream URL for `request`: same path and query, byte for byte."""
    return URL(str(request.app[SETTINGS].upstream_origin) + upstream_path(request), encoded=True)


async def forward(request: web.Request) -> web.StreamResponse:
    """The catch-all handler: every method, every path."""
    if is_websocket_upgrade(request):
        return await relay_websocket(request, upstream_url(request))
    addons, metrics = request.app[ADDONS], request.app[METRICS]
    flow = Flow(request, upstream_request_headers(request))
    for addon in addons:
        await addon.request_headers(flow)
    started = time.perf_counter()
    try:
        upstream = await request.app[UPSTREAM].request(
            request.method,
            upstream_url(request),
            headers=flow.upstream_headers,
            data=request.content if request.body_exists else None,
            allow_redirects=False,
        )
    except (aiohttp.ClientConnectionError, TimeoutError) as error:
        metrics.requests.labels(request.method, "502").inc()
        return bad_gateway(request.app[SETTINGS].upstream_origin, error)
    metrics.upstream_seconds.observe(time.perf_counter() - started)
    metrics.requests.labels(request.method, str(upstream.status)).inc()
    async with upstream:
        flow.status = upstream.status
        flow.response_headers = client_response_headers(upstream.headers)
        for addon in addons:
            await addon.response_headers(flow)
        if flow.read_body:
            return await _answer_whole(flow, upstream, addons)
        if is_event_stream(upstream):
            with metrics.open_streams.track_inprogress():
                return await _stream(request, flow, upstream)
        return await _stream(request, flow, upstream)


def is_event_stream(response: aiohttp.ClientResponse) -> bool:
    """SSE: flushed event by event, never timed out, and ended cleanly if the upstream dies."""
    return response.content_type == "text/event-stream"


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
    try:
        async for chunk in upstream.content.iter_any():
            await response.write(chunk)
    except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError):
        if not is_event_stream(upstream):
            raise  # the client must see a truncated body as truncated, so the connection is dropped
        log.info("upstream closed %s mid-stream; the client's stream ends and it may reconnect", request.path)
    await response.write_eof()
    return response
