"""Event streams the proxy slips events into are asked uncompressed (newer 2.x servers compress
what a client accepts compressed); one that comes compressed all the same is relayed as sent,
nothing slipped in, said once in the log."""

from __future__ import annotations

import asyncio
import gzip
import logging
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from yarl import URL

from proxy.relay.departures import Departures
from proxy.relay.forward import Around, Forwarder
from proxy.relay.hooks import Addon, Addons, Flow
from proxy.relay.options import RelayMetrics, RelayOptions
from proxy.relay.stopping import OpenStreams
from proxy.relay.transport import Transport
from proxy.service.app import create_app
from proxy.service.config import Settings
from tests.opencode2.proxied import Client

EVENTS = b'data: {"type":"server.connected","data":{}}\n\ndata: {"type":"session.step.started","data":{}}\n\n'
SLIPPED = b'data: {"type":"session.tool.failed","data":{}}\n\n'


async def _gzipping_upstream(asked: list[str]) -> AsyncIterator[URL]:
    """An event stream gzipped whatever the request accepts (a server that ignores `identity`)."""

    async def events(request: web.Request) -> web.StreamResponse:
        asked.append(request.headers.get("Accept-Encoding", ""))
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Content-Encoding": "gzip"}
        )
        await response.prepare(request)
        await response.write(gzip.compress(EVENTS))
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/api/event", events)
    async with TestServer(app) as server:
        yield URL(str(server.make_url("/")))


@pytest.fixture
async def asked() -> list[str]:
    return []


@pytest.fixture
async def upstream(asked: list[str]) -> AsyncIterator[URL]:
    async for url in _gzipping_upstream(asked):
        yield url


async def test_an_event_stream_is_asked_uncompressed_whatever_the_client_accepts(
    aiohttp_client: Client, upstream: URL, asked: list[str]
) -> None:
    client = await aiohttp_client(create_app(Settings(upstream=upstream)))
    response = await client.get("/api/event", headers={"Accept-Encoding": "gzip, deflate, br, zstd"})
    await response.read()
    assert asked == ["identity"]


class Slips(Addon):
    """Slips one event into every stream."""

    name = "slips"

    async def response_headers(self, flow: Flow) -> None:
        events: asyncio.Queue[bytes] = asyncio.Queue()
        events.put_nowait(SLIPPED)
        flow.inject(events, by=self.name)


async def test_a_stream_compressed_all_the_same_is_relayed_as_sent_with_nothing_slipped_in(
    upstream: URL, caplog: pytest.LogCaptureFixture
) -> None:
    registry = CollectorRegistry()
    metrics = RelayMetrics(
        Counter("requests", "t", ("method", "status"), registry=registry),
        Histogram("upstream_seconds", "t", registry=registry),
        Gauge("open_streams", "t", registry=registry),
    )
    errors = Counter("addon_errors", "t", ("addon", "hook"), registry=registry)
    app = web.Application()
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        transport = Transport(upstream.origin(), 5.0)
        around = Around(Departures(), OpenStreams(), session)
        options = RelayOptions(upstream.origin(), 5.0)
        forwarder = Forwarder(options, metrics, transport, Addons([Slips()], errors), around)
        app.router.add_route("*", "/{tail:.*}", forwarder.forward)
        async with TestServer(app) as server, aiohttp.ClientSession() as client:
            with caplog.at_level(logging.WARNING, "proxy.relay.forward"):
                async with client.get(server.make_url("/api/event")) as response:
                    body = await response.read()  # decoded by the client, as the server's
        await transport.close()
    assert body == EVENTS
    said = [record.getMessage() for record in caplog.records]
    assert said == [
        "/api/event came gzip-encoded though asked for identity: relayed as sent, nothing slipped in"
    ]
