"""Forward one HTTP request upstream and stream the answer back.

Bodies flow through in both directions as they arrive: event streams reach the client
event by event, downloads never sit in memory. Only a flow an addon asked to read is
buffered, and then its framing headers are rebuilt to match what is really sent.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import TypeVar

import aiohttp
from aiohttp import hdrs, web
from prometheus_client import Counter
from yarl import URL

from proxy.relay.answers import UpstreamError, UpstreamResponse
from proxy.relay.departures import Departures
from proxy.relay.errors import bad_gateway, gateway_timeout, transfer_coding_refused
from proxy.relay.headers import (
    UPSTREAM_HEADERS,
    client_response_headers,
    unsupported_transfer_coding,
    upstream_request_headers,
)
from proxy.relay.hooks import Addons, Flow
from proxy.relay.options import RelayMetrics, RelayOptions
from proxy.relay.sse import relay_with_injection
from proxy.relay.stopping import OpenStreams
from proxy.relay.transport import Transport
from proxy.relay.websocket import is_websocket_upgrade, relay_websocket
from proxy.relay.whole import Past, WholeBody

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Around:
    """What a forwarder shares with the application around it: the clients that left
    (`departures`), the streams a stop cuts (`streams`), and the session WebSockets go through."""

    departures: Departures
    streams: OpenStreams
    session: aiohttp.ClientSession


class Forwarder:
    """The catch-all handler (every method, every path), and what it forwards with.

    Its collaborators are given once, at construction, as `httputil.ReverseProxy`'s fields are:
    the options, metrics, its `Transport`, the addons, what it shares with the application and
    the mount prefix; none is looked up per request. Its owner closes the transport.
    """

    def __init__(
        self,
        options: RelayOptions,
        metrics: RelayMetrics,
        transport: Transport,
        addons: Addons,
        around: Around,
        *,
        prefix: str = "",
    ) -> None:
        self.options = options
        self.metrics = metrics
        self.transport = transport
        self.addons = addons
        self.departures = around.departures
        self.streams = around.streams
        """The event streams and WebSockets it relays, which a stop cuts."""
        self.session = around.session
        self.prefix = prefix
        self._origin = str(options.upstream_origin)
        self._counters: dict[tuple[str, int], Counter] = {}

    def upstream_url(self, request: web.Request) -> URL:
        """The upstream URL for `request`: same path and query, byte for byte, without the prefix."""
        return URL(self._origin + request.raw_path.removeprefix(self.prefix), encoded=True)

    async def forward(self, request: web.Request) -> web.StreamResponse:
        """The handler: every method, every path."""
        if (codings := unsupported_transfer_coding(request)) is not None:
            return transfer_coding_refused(codings)
        if is_websocket_upgrade(request):
            with self.streams.holding(request):
                return await relay_websocket(request, self.upstream_url(request), self.session, self.metrics)
        options = self.options
        flow = Flow(request, upstream_request_headers(request), options.response_timeout, options.max_body)
        try:
            with self.departures.watching(request):
                return await self._exchange(flow)
        finally:
            await self.addons.trigger("done", flow)

    async def _exchange(self, flow: Flow) -> web.StreamResponse:
        request, metrics, addons = flow.request, self.metrics, self.addons
        await addons.trigger("request_headers", flow)
        started = time.perf_counter()
        try:
            upstream = await _bounded(self._send(flow), flow.start_timeout)
        except (UpstreamError, TimeoutError) as error:
            # Unreachable, or an answer aiohttp cannot parse (bad status line, invalid header):
            # either way the client gets JSON it can show, never a bare 500.
            failure = _failure(self.options.upstream_origin, error, flow.start_timeout)
            self._count(request.method, failure.status)
            return failure
        metrics.upstream_seconds.observe(time.perf_counter() - started)
        self._count(request.method, upstream.status)
        async with upstream:
            return await self._respond(flow, upstream)

    def _send(self, flow: Flow) -> Awaitable[UpstreamResponse]:
        """The request upstream: same method and target, byte for byte, without the prefix; a body
        goes on as it arrives, with its length, or chunked when the client sent it chunked."""
        request = flow.request
        target = request.raw_path.removeprefix(self.prefix)
        if not request.body_exists:
            return self.transport.request(request.method, target, flow.upstream_headers)
        chunked = hdrs.CONTENT_LENGTH not in flow.upstream_headers
        return self.transport.request(
            request.method, target, flow.upstream_headers, request.content.iter_any(), chunked=chunked
        )

    def _count(self, method: str, status: int) -> None:
        """One request more by method and status; the labelled counter is looked up once (a
        look-up takes a lock and builds the labels anew), and there are no more of them than
        the metric itself keeps."""
        counter = self._counters.get((method, status))
        if counter is None:
            counter = self._counters[method, status] = self.metrics.requests.labels(method, str(status))
        counter.inc()

    async def _respond(self, flow: Flow, upstream: UpstreamResponse) -> web.StreamResponse:
        flow.status = upstream.status
        flow.response_headers = client_response_headers(upstream.headers)
        flow.content_length = upstream.content_length
        await self.addons.trigger("response_headers", flow)
        max_wait = self.options.response_timeout
        if flow.reads_whole:
            return await self._answer_whole(flow, upstream, max_wait)
        if is_event_stream(upstream):
            with self.metrics.open_streams.track_inprogress(), self.streams.holding(flow.request):
                # A quiet stream is not a stuck one.
                return await _send_streamed(flow, upstream, _pieces(upstream, None))
        return await self._stream(flow, upstream, max_wait)

    async def _answer_whole(
        self, flow: Flow, upstream: UpstreamResponse, max_wait: float | None
    ) -> web.StreamResponse:
        if (flow.content_length or 0) > flow.max_body:
            return await _unchecked(flow, upstream, "encoded", _pieces(upstream, max_wait))
        body = WholeBody(flow)
        try:
            while piece := await _bounded(upstream.content.readany(), max_wait):
                if (past := body.add(piece)) is not None:
                    rest = _prepended(body.pieces, _pieces(upstream, max_wait))
                    return await _unchecked(flow, upstream, past, rest)
        except (UpstreamError, TimeoutError) as error:
            # Nothing was sent yet: a clean error is possible.
            return _failure(self.options.upstream_origin, error, max_wait)
        flow.body = body.whole()
        await self.addons.trigger("response", flow)
        return _answer(flow, upstream, flow.body)

    async def _stream(
        self, flow: Flow, upstream: UpstreamResponse, max_wait: float | None
    ) -> web.StreamResponse:
        if flow.injected is not None:
            return await _send_streamed(flow, upstream, _pieces(upstream, max_wait))
        try:
            # Read before any iterator is made: an async generator costs a registration with the
            # loop (a WeakSet), a visible share of a small answer.
            first = await _bounded(upstream.content.readany(), max_wait)
        except (UpstreamError, TimeoutError) as error:
            # Nothing was sent yet: a clean error is possible.
            return _failure(self.options.upstream_origin, error, max_wait)
        if first and upstream.content.at_eof():
            # The whole body came in one piece (most answers do): headers and body in one write.
            return _answer(flow, upstream, first)
        return await _send_streamed(flow, upstream, _prepended(deque((first,)), _pieces(upstream, max_wait)))


def is_event_stream(response: UpstreamResponse) -> bool:
    """SSE: flushed event by event, and never timed out."""
    return response.content_type == "text/event-stream"


def _failure(origin: URL, error: BaseException, timeout: float | None) -> web.Response:
    """The JSON answer for an upstream that failed before the client got a byte: 504 when the
    proxy's own response timeout ran out, 502 for everything else."""
    if timeout is not None and isinstance(error, TimeoutError):
        return gateway_timeout(origin, timeout)
    return bad_gateway(origin, error)


async def _bounded(step: Awaitable[T], max_wait: float | None) -> T:
    """`step`, bounded by `max_wait` seconds (None: never; no timer is armed for it, which is
    measurable on every request)."""
    if max_wait is None:
        return await step
    async with asyncio.timeout(max_wait):
        return await step


async def _pieces(upstream: UpstreamResponse, max_wait: float | None) -> AsyncIterator[bytes]:
    """The body as it arrives; each wait for its next piece is bounded by `max_wait` (None: never)."""
    while piece := await _bounded(upstream.content.readany(), max_wait):
        yield piece


async def _unchecked(
    flow: Flow, upstream: UpstreamResponse, past: Past, pieces: AsyncIterator[bytes]
) -> web.StreamResponse:
    """A body too large to read whole goes out as a plain body does, piece by piece, unread."""
    fields = {"path": flow.request.path, "limit": flow.max_body, "past": past}
    log.warning(
        "body of %s is past %d bytes %s: relayed unchecked, as the upstream sent it",
        flow.request.path,
        flow.max_body,
        past,
        extra={"fields": fields},
    )
    return await _send_streamed(flow, upstream, pieces)


async def _send_streamed(
    flow: Flow, upstream: UpstreamResponse, pieces: AsyncIterator[bytes]
) -> web.StreamResponse:
    request = flow.request
    response = _answer(flow, upstream)
    if upstream.content_length is not None and hdrs.TRANSFER_ENCODING not in upstream.headers:
        response.content_length = upstream.content_length
    await response.prepare(request)
    try:
        if flow.injected is not None and not _encoded(flow, upstream):
            await relay_with_injection(response, upstream, flow.injected, flow.opened)
        else:
            async for piece in pieces:
                await response.write(piece)
    except ConnectionResetError:
        return response  # the client left; only a handler that is not cancelled then gets here
    except (UpstreamError, TimeoutError) as error:
        # An event stream too: clients (the JS SDK) reconnect a stream that was cut, and take
        # one that ended cleanly as the server's "no more", so it must end as the server's did.
        return _cut(request, response, error)
    await response.write_eof()
    return response


def _encoded(flow: Flow, upstream: UpstreamResponse) -> bool:
    """Whether a stream asked for uncompressed came compressed all the same: an event slipped in
    between compressed bytes would corrupt it, so it is relayed as sent, with nothing slipped in."""
    coding = upstream.headers.get(hdrs.CONTENT_ENCODING, "identity").strip().lower()
    if coding == "identity":
        return False
    fields = {"path": flow.request.path, "coding": coding}
    log.warning(
        "%s came %s-encoded though asked for identity: relayed as sent, nothing slipped in",
        flow.request.path,
        coding,
        extra={"fields": fields},
    )
    return True


def _answer(flow: Flow, upstream: UpstreamResponse, body: bytes | None = None) -> web.StreamResponse:
    """The client's response for the upstream's: whole when `body` is given, else to be streamed."""
    status, reason, headers = flow.status, upstream.reason, flow.response_headers
    response = (
        web.StreamResponse(status=status, reason=reason, headers=headers)
        if body is None
        else web.Response(status=status, reason=reason, headers=headers, body=body)
    )
    response[UPSTREAM_HEADERS] = upstream.headers
    return response


async def _prepended(first: deque[bytes], rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """`first`, then `rest`; each piece of `first` is let go once it is written."""
    while first:
        if piece := first.popleft():
            yield piece
    async for piece in rest:
        yield piece


def _cut(request: web.Request, response: web.StreamResponse, error: BaseException) -> web.StreamResponse:
    """End the client's connection without ending the body: a last chunk, or a clean close after a
    body without length, would make a truncated body look complete."""
    log.warning("upstream failed mid-body of %s (%s); the client's connection is cut", request.path, error)
    if request.transport is not None:
        request.transport.close()
    return response
