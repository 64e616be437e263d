"""Pass-through: everything that is not a message view reaches the client as the upstream sent it."""

import asyncio
import gzip
from collections.abc import AsyncIterator

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from yarl import URL

from proxy.relay.departures import Departures
from proxy.relay.forward import Around, Forwarder
from proxy.relay.hooks import Addons
from proxy.relay.options import RelayMetrics, RelayOptions
from proxy.relay.stopping import OpenStreams
from proxy.relay.transport import Transport
from proxy.service.app import create_app
from proxy.service.config import Settings
from proxy.supervision.server_command import free_loopback_port
from tests.proxy.conftest import ProxyClient
from tests.proxy.fake_opencode import FakeOpencode


async def test_method_path_query_and_body_are_forwarded(proxy: ProxyClient) -> None:
    exact = URL(f"http://127.0.0.1:{proxy.port}/echo?a=1&b=%2F", encoded=True)
    response = await proxy.session.post(exact, data=b"payload", headers={"Authorization": "Basic eA=="})
    echoed = await response.json()
    assert echoed["method"] == "POST"
    assert echoed["path_qs"] == "/echo?a=1&b=%2F"
    assert echoed["body"] == "payload"
    assert echoed["headers"]["Authorization"] == "Basic eA=="


async def test_request_body_is_streamed_in_chunks(proxy: ProxyClient) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for piece in (b"one ", b"two ", b"three"):
            yield piece
            await asyncio.sleep(0.01)  # the point: the body arrives in pieces

    response = await proxy.put("/echo", data=chunks())
    assert (await response.json())["body"] == "one two three"


async def test_hop_by_hop_headers_are_dropped_both_ways(proxy: ProxyClient) -> None:
    response = await proxy.get(
        "/echo",
        headers={
            "Connection": "keep-alive, X-Secret-Hop",
            "X-Secret-Hop": "1",
            "Proxy-Authorization": "x",
            "TE": "trailers",
            "X-Kept": "y",
        },
    )
    sent = (await response.json())["headers"]
    assert "X-Secret-Hop" not in sent
    assert "Proxy-Authorization" not in sent
    assert "TE" not in sent
    assert sent["X-Kept"] == "y"
    assert "X-Hop" not in response.headers
    assert response.headers["X-End"] == "2"


async def test_forwarded_headers_point_back_at_the_proxy(proxy: ProxyClient) -> None:
    response = await proxy.get("/echo", headers={"X-Forwarded-For": "10.1.1.1"})
    sent = (await response.json())["headers"]
    assert sent["X-Forwarded-For"] == "10.1.1.1, 127.0.0.1"
    assert sent["X-Forwarded-Proto"] == "http"
    assert sent["X-Forwarded-Host"] == sent["Host"] == f"127.0.0.1:{proxy.port}"


async def test_no_headers_are_invented(proxy: ProxyClient) -> None:
    response = await proxy.get("/echo", skip_auto_headers=("Accept-Encoding", "Accept", "User-Agent"))
    sent = (await response.json())["headers"]
    assert "Accept-Encoding" not in sent
    assert "User-Agent" not in sent


async def test_compressed_body_passes_through_with_its_encoding(proxy: ProxyClient) -> None:
    response = await proxy.get("/gzip", headers={"Accept-Encoding": "gzip"}, auto_decompress=False)
    body = await response.read()
    assert response.headers["Content-Encoding"] == "gzip"
    assert int(response.headers["Content-Length"]) == len(body)
    assert orjson.loads(gzip.decompress(body))["big"] == "x" * 2048


async def test_message_views_are_fetched_uncompressed(proxy: ProxyClient, fake: FakeOpencode) -> None:
    fake.bodies["/api/session/s/message"] = b'{"data":[]}'
    response = await proxy.get("/api/session/s/message", headers={"Accept-Encoding": "gzip, zstd"})
    assert await response.read() == b'{"data":[]}'
    assert fake.seen[-1].headers["Accept-Encoding"] == "identity"


async def test_sse_arrives_event_by_event(proxy: ProxyClient, fake: FakeOpencode) -> None:
    """The upstream sends the rest only once the client has the first event: a buffering proxy deadlocks."""
    response = await proxy.get("/events?count=3")
    assert response.headers["Content-Type"] == "text/event-stream"
    first = await asyncio.wait_for(response.content.readuntil(b"\n\n"), 10)
    assert first == b"data: 0\n\n"
    fake.release.set()
    assert await response.read() == b"data: 1\n\ndata: 2\n\n"


async def test_websocket_is_relayed_both_ways(proxy: ProxyClient) -> None:
    async with proxy.ws_connect("/pty/pty_1/connect") as ws:
        await ws.send_str("echo hi")
        assert (await ws.receive_str()) == "echo:echo hi"
        await ws.send_bytes(b"\x01\x02")
        assert (await ws.receive_bytes()) == b"\x02\x01"


async def test_refused_websocket_handshake_reaches_the_client(proxy: ProxyClient) -> None:
    response = await proxy.get(
        "/api/nothing",
        headers={
            "Connection": "Upgrade",
            "Upgrade": "websocket",
            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
            "Sec-WebSocket-Version": "13",
        },
    )
    assert response.status == 404


async def test_unreachable_upstream_is_a_json_502(aiohttp_client) -> None:  # type: ignore[no-untyped-def]
    upstream = URL(f"http://127.0.0.1:{free_loopback_port()}")
    client: ProxyClient = await aiohttp_client(create_app(Settings(upstream=upstream)))
    response = await client.get("/api/session/active")
    assert response.status == 502
    error = await response.json()
    assert error["upstream"] == str(upstream)
    assert str(upstream) in error["message"]


async def test_upstream_status_and_headers_pass(proxy: ProxyClient) -> None:
    response = await proxy.get("/missing/thing")
    assert response.status == 404


async def _raw_upstream(head: bytes, pieces: list[bytes]) -> asyncio.Server:
    """An upstream that answers every request with `head` and then `pieces`, a pause between
    them, so a body can arrive whole or piece by piece; it sends exactly these bytes."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.readline() not in (b"\r\n", b""):
            pass
        writer.write(head)
        for piece in pieces:
            await asyncio.sleep(0.05)  # the point: a pause between pieces
            writer.write(piece)
            await writer.drain()
        writer.close()

    return await asyncio.start_server(answer, "127.0.0.1", 0)


@pytest.mark.parametrize("pieces", [[b"hello"], [b"hel", b"lo"]], ids=["whole", "in-pieces"])
@pytest.mark.parametrize(
    ("sent", "expected"),
    [
        (b"", {}),
        (
            b"Server: opencode\r\nContent-Type: text/x-thing\r\n",
            {"Server": "opencode", "Content-Type": "text/x-thing"},
        ),
    ],
    ids=["absent", "present"],
)
async def test_server_and_content_type_are_the_upstreams_or_none(  # type: ignore[no-untyped-def]
    aiohttp_client,
    pieces: list[bytes],
    sent: bytes,
    expected: dict[str, str],
) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n" + sent + b"\r\n"
    server = await _raw_upstream(head, pieces)
    try:
        port = server.sockets[0].getsockname()[1]
        client: ProxyClient = await aiohttp_client(
            create_app(Settings(upstream=URL(f"http://127.0.0.1:{port}")))
        )
        response = await client.get("/file/content")
        assert await response.read() == b"hello"
        assert {name: response.headers.get(name) for name in ("Server", "Content-Type")} == {
            "Server": expected.get("Server"),
            "Content-Type": expected.get("Content-Type"),
        }
        assert "Date" in response.headers
    finally:
        server.close()
        await server.wait_closed()


_SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
_FIRST_EVENT = b'data: {"payload":{"type":"server.connected","properties":{}}}\n\n'


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


@pytest.mark.parametrize("path", ["/event", "/global/event", "/api/session/ses_1/event", "/other/stream"])
@pytest.mark.parametrize("clean", [True, False], ids=["ended", "cut"])
async def test_an_event_stream_ends_the_way_the_upstreams_ended(  # type: ignore[no-untyped-def]
    aiohttp_client, path: str, clean: bool
) -> None:
    """A client (the JS SDK) reconnects a stream that was cut and gives up on one that ended:
    through the proxy, a crashed server's stream must look cut, a closed one closed."""
    pieces = [_chunk(_FIRST_EVENT), b"0\r\n\r\n" if clean else _chunk(b'data: {"half')]
    server = await _raw_upstream(_SSE_HEAD, pieces)
    try:
        port = server.sockets[0].getsockname()[1]
        settings = Settings(upstream=URL(f"http://127.0.0.1:{port}"), grace=60)
        client: ProxyClient = await aiohttp_client(create_app(settings))
        response = await client.get(path, params={"directory": "/cwd"})
        assert response.status == 200
        if clean:
            assert await response.read() == _FIRST_EVENT
        else:
            with pytest.raises(aiohttp.ClientPayloadError):
                await response.read()
    finally:
        server.close()
        await server.wait_closed()


async def test_forwarding_needs_nothing_from_the_application(upstream: TestServer) -> None:
    """Its collaborators are given to the forwarder once, not looked up in the app per request."""
    registry = CollectorRegistry()
    metrics = RelayMetrics(
        Counter("requests", "t", ("method", "status"), registry=registry),
        Histogram("upstream_seconds", "t", registry=registry),
        Gauge("open_streams", "t", registry=registry),
    )
    origin = URL(str(upstream.make_url("/"))).origin()
    errors = Counter("addon_errors", "t", ("addon", "hook"), registry=registry)
    app = web.Application()  # no keys at all
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        transport = Transport(origin, 5.0)
        around = Around(Departures(), OpenStreams(), session)
        forwarder = Forwarder(RelayOptions(origin, 5.0), metrics, transport, Addons([], errors), around)
        app.router.add_route("*", "/{tail:.*}", forwarder.forward)
        async with TestServer(app) as server, session.get(server.make_url("/echo?a=1")) as response:
            assert response.status == 200
            assert (await response.json())["path_qs"] == "/echo?a=1"
        await transport.close()
    assert registry.get_sample_value("requests_total", {"method": "GET", "status": "200"}) == 1.0
