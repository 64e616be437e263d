"""Upstream faults against fakes: malformed or dying responses, hanging and slow upstreams, an
upstream that is down when the proxy starts. (The real server killed mid-request, mid-stream and
mid-WebSocket is in `tests/integration/test_faults.py`.)

The rule under test: whatever the upstream does, a client gets either the upstream's answer, a
JSON error (502, or 504 for a timeout) or, once a body has started, a connection that ends
visibly short; plain exchanges are bounded by the proxy's timeouts, streams never are.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from yarl import URL

from proxy.addons.settle import SETTLED_HEADER
from proxy.service.app import create_app
from proxy.service.config import Settings
from tests.fixtures import compact
from tests.integration.http_client import free_port
from tests.reliability.load_upstream import LoadUpstream
from tests.reliability.raw_upstream import Received, Reply, Responder, opencode_routes, raw_upstream, response
from tests.reliability.servers import proxy_subprocess, serve

V2 = "ses_fault_v2"
MESSAGES = f"/api/session/{V2}/message"
PLAIN = "/config"
CLIENT_TIMEOUT = aiohttp.ClientTimeout(total=20)
TIMEOUT_S = 0.5
"""The response and liveness timeouts the timing tests give the proxy."""
SLACK_S = 4.0
"""Scheduling delay allowed on a busy machine: bounded means well under the client's 20 s."""


@asynccontextmanager
async def proxy_in_front(
    responder: Responder, *, response_timeout: float | None = None, **settings: Any
) -> AsyncIterator[URL]:
    """An in-process proxy in front of a raw upstream answering with `responder`."""
    async with raw_upstream(responder) as (upstream, _):
        app = create_app(Settings(upstream=upstream, response_timeout=response_timeout, **settings))
        async with serve(app) as proxy:
            yield proxy


def always(reply: Reply) -> Responder:
    async def respond(_: Received) -> Reply:
        return reply

    return respond


async def _never(_: Received) -> Reply:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


async def get(url: URL) -> tuple[int, dict[str, str], bytes]:
    async with aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as session, session.get(url) as answer:
        return answer.status, dict(answer.headers), await answer.read()


async def _assert_json_error(url: URL, status: int, error: str) -> None:
    """The proxy's own JSON error, never aiohttp's plain-text 500."""
    got, headers, body = await get(url)
    assert (got, headers["Content-Type"].split(";")[0]) == (status, "application/json"), body[:300]
    assert orjson.loads(body)["error"] == error


MALFORMED_HEADS = {
    "garbage status line": b"HELLO WORLD\r\n\r\n",
    "NUL in a header value": b"HTTP/1.1 200 OK\r\nX-A: b\x00c\r\nContent-Length: 2\r\n\r\nok",
    "bare CR in a header value": b"HTTP/1.1 200 OK\r\nX-A: b\rX-B: c\r\nContent-Length: 2\r\n\r\nok",
    "Content-Length with Transfer-Encoding": (
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"
    ),
    "a 20 kB header": b"HTTP/1.1 200 OK\r\nX-A: " + b"a" * 20_000 + b"\r\nContent-Length: 2\r\n\r\nok",
    "closed before answering": b"",
}


@pytest.mark.parametrize("path", [PLAIN, MESSAGES])
@pytest.mark.parametrize("head", MALFORMED_HEADS.values(), ids=MALFORMED_HEADS.keys())
async def test_malformed_response_head_is_a_json_502(path: str, head: bytes) -> None:
    async with proxy_in_front(opencode_routes(always(Reply(head, "close")))) as proxy:
        await _assert_json_error(proxy.with_path(path), 502, "bad_gateway")
        status, _, _ = await get(proxy.with_path("/_settle/metrics"))
        assert status == 200, "the proxy must still serve"


BROKEN_BODIES = {
    "short of its Content-Length": (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n" + b'{"data":['
    ),
    "invalid chunk size": b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    "chunked, cut mid-way": (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n9\r\n"
        + b'{"data":['
    ),
}


@pytest.mark.parametrize("head", BROKEN_BODIES.values(), ids=BROKEN_BODIES.keys())
async def test_upstream_dying_mid_body_of_a_message_view_is_a_json_502(head: bytes) -> None:
    """A message view is read whole before it is sent, so its failure can still be a clean 502."""
    async with proxy_in_front(opencode_routes(always(Reply(head, "close")))) as proxy:
        await _assert_json_error(proxy.with_path(MESSAGES), 502, "bad_gateway")


@pytest.mark.parametrize("head", BROKEN_BODIES.values(), ids=BROKEN_BODIES.keys())
async def test_upstream_dying_mid_body_of_a_stream_is_never_a_complete_answer(head: bytes) -> None:
    """A streamed body whose failure shows before the status went out is a 502; after, the client
    must see the body cut short, never a 200 that looks complete."""
    async with proxy_in_front(opencode_routes(always(Reply(head, "close")))) as proxy:
        try:
            status, _, body = await get(proxy.with_path(PLAIN))
        except aiohttp.ClientPayloadError:
            pass
        else:
            assert status == 502, f"a broken body arrived as a complete {status}: {body!r}"
        assert (await get(proxy.with_path("/_settle/metrics")))[0] == 200


async def test_upstream_dying_mid_event_stream_cuts_it() -> None:
    """An event stream the upstream did not end is cut for the client too: clients (the JS SDK)
    reconnect after an error, and take a clean end as "no more events"."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    event = b"data: 1\n\n"
    async with (
        raw_upstream(
            opencode_routes(always(Reply(head + b"%x\r\n%s\r\n" % (len(event), event), "hang")))
        ) as (
            upstream,
            server,
        ),
        serve(create_app(Settings(upstream=upstream))) as proxy,
        aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as session,
        session.get(proxy.with_path("/event")) as stream,
    ):
        assert await stream.content.readuntil(b"\n\n") == event
        await server.close_connections()
        with pytest.raises(aiohttp.ClientPayloadError):
            await stream.read()


async def _timed(call: Awaitable[None]) -> float:
    started = time.monotonic()
    await call
    return time.monotonic() - started


@pytest.mark.parametrize("path", [PLAIN, MESSAGES])
async def test_hanging_upstream_is_a_json_504_after_the_response_timeout(path: str) -> None:
    async with proxy_in_front(opencode_routes(_never), response_timeout=TIMEOUT_S) as proxy:
        took = await _timed(_assert_json_error(proxy.with_path(path), 504, "gateway_timeout"))
    assert TIMEOUT_S <= took < TIMEOUT_S + SLACK_S


def _stalls_after(head: bytes) -> Responder:
    return opencode_routes(always(Reply(head, "hang")))


async def test_body_stalling_after_the_headers_is_bounded_too() -> None:
    """The timeout covers each wait for the upstream, not only the one for its headers."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n" + b'{"data":['
    async with proxy_in_front(_stalls_after(head), response_timeout=TIMEOUT_S) as proxy:
        took = await _timed(_assert_json_error(proxy.with_path(MESSAGES), 504, "gateway_timeout"))
        assert took < TIMEOUT_S + SLACK_S

        async def truncated() -> None:
            with pytest.raises(aiohttp.ClientPayloadError):
                await get(proxy.with_path(PLAIN))

        assert await _timed(truncated()) < TIMEOUT_S + SLACK_S


async def test_slow_liveness_look_up_passes_the_body_on_unchanged_in_time() -> None:
    body = compact("v2-message-stale-running.json")
    routes = opencode_routes(always(response(200, body, [("Content-Type", "application/json")])))

    async def respond(request: Received) -> Reply:
        if request.path == "/api/session/active":
            await asyncio.sleep(30)
        return await routes(request)

    async with proxy_in_front(respond, liveness_timeout=TIMEOUT_S) as proxy:
        started = time.monotonic()
        status, headers, got = await get(proxy.with_path(MESSAGES))
        took = time.monotonic() - started
    assert (status, got) == (200, body)
    assert SETTLED_HEADER not in headers
    assert TIMEOUT_S <= took < TIMEOUT_S + SLACK_S


async def _events(request: web.Request) -> web.StreamResponse:
    """Three events `?gap=` seconds apart."""
    events = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await events.prepare(request)
    for number in range(3):
        if number:
            await asyncio.sleep(float(request.query["gap"]))
        await events.write(b"data: %d\n\n" % number)
    return events


async def _pty(request: web.Request) -> web.WebSocketResponse:
    """Echoes text; on "die" drops its TCP connection without a close frame, as a killed server does."""
    socket = web.WebSocketResponse()
    await socket.prepare(request)
    async for message in socket:
        if message.data == "die" and request.transport is not None:
            request.transport.abort()
            break
        await socket.send_str(f"echo:{message.data}")
    return socket


@asynccontextmanager
async def proxy_in_front_of_streams(response_timeout: float | None = None) -> AsyncIterator[URL]:
    """A proxy in front of an aiohttp upstream serving `/events` and `/pty/{id}/connect`."""
    app = web.Application()
    app.router.add_get("/events", _events)
    app.router.add_get("/pty/{id}/connect", _pty)
    async with serve(app) as upstream:
        proxy_app = create_app(Settings(upstream=upstream, response_timeout=response_timeout))
        async with serve(proxy_app) as proxy:
            yield proxy


@pytest.mark.slow
async def test_event_stream_gaps_longer_than_the_timeout_are_fine() -> None:
    async with proxy_in_front_of_streams(TIMEOUT_S) as proxy:
        url = proxy.with_path("/events").with_query(gap=3 * TIMEOUT_S)
        assert (await get(url))[2] == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"


@pytest.mark.slow
async def test_websocket_silence_longer_than_the_timeout_is_fine() -> None:
    async with (
        proxy_in_front_of_streams(TIMEOUT_S) as proxy,
        aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as session,
        session.ws_connect(proxy.with_path("/pty/pty_1/connect")) as socket,
    ):
        await asyncio.sleep(3 * TIMEOUT_S)
        await socket.send_str("still there?")
        assert await socket.receive_str(timeout=5) == "echo:still there?"


async def _poll_status(url: URL, want: int, within: float) -> dict[str, Any]:
    """GET `url` until it answers `want` (JSON), or fail after `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        async with aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as session, session.get(url) as answer:
            if answer.status == want:
                body: dict[str, Any] = await answer.json()
                return body
        assert time.monotonic() < deadline, f"{url} never answered {want}"
        await asyncio.sleep(0.1)


@pytest.mark.slow
async def test_upstream_down_at_start_then_up(tmp_path: Path) -> None:
    """The proxy starts without its upstream, says so, answers 502 JSON, and needs no restart."""
    port = free_port()
    upstream = URL(f"http://127.0.0.1:{port}")
    async with proxy_subprocess(upstream, tmp_path / "proxy.log") as proxy:
        health = await _poll_status(proxy.url.with_path("/_settle/health"), 503, within=5)
        assert health["upstream"]["reachable"] is False
        await _assert_json_error(proxy.url.with_path("/small"), 502, "bad_gateway")
        async with serve(LoadUpstream().app(), port=port):
            health = await _poll_status(proxy.url.with_path("/_settle/health"), 200, within=10)
            assert health["upstream"]["reachable"] is True
            assert (await get(proxy.url.with_path("/small")))[0] == 200
            await _poll_status(proxy.url.with_path("/_settle/health"), 200, within=10)


async def test_upstream_websocket_dropped_is_a_clean_close() -> None:
    """The client gets a close frame with a code it may receive (1006 must never be sent)."""
    async with (
        proxy_in_front_of_streams() as proxy,
        aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as session,
        session.ws_connect(proxy.with_path("/pty/pty_1/connect")) as socket,
    ):
        await socket.send_str("hi")
        assert await socket.receive_str(timeout=5) == "echo:hi"
        await socket.send_str("die")
        closing = await socket.receive(timeout=5)
        assert closing.type is aiohttp.WSMsgType.CLOSE, closing
        assert closing.data not in (1005, 1006, 1015), f"reserved close code {closing.data} sent"
        assert (await get(proxy.with_path("/_settle/metrics")))[0] == 200


async def test_client_typing_while_the_upstream_websocket_drops(caplog: pytest.LogCaptureFixture) -> None:
    """Frames still arriving from the client after the upstream vanished are dropped quietly."""
    async with (
        proxy_in_front_of_streams() as proxy,
        aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as session,
        session.ws_connect(proxy.with_path("/pty/pty_1/connect")) as socket,
    ):
        await socket.send_str("die")
        for number in range(10_000):
            if socket.closed:
                break
            with contextlib.suppress(ConnectionError):
                await socket.send_str(f"key {number}")
            await asyncio.sleep(0)
        closing = await socket.receive(timeout=5)
        assert closing.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED), closing
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


def _first_subscription_hangs() -> Responder:
    """opencode measured: a request sent the instant its port opens after a (re)start gets no
    answer at all (20 s and more, 3 of 3 tries); later ones are served. Here the first
    `/global/event` hangs and every later one is a live stream."""
    subscriptions = 0
    connected = b'data: {"payload":{"type":"server.connected","properties":{}}}\n\n'
    stream = response(200, connected, [("Content-Type", "text/event-stream")], framing="chunked")
    routes = opencode_routes(always(response(404)))

    async def respond(request: Received) -> Reply:
        nonlocal subscriptions
        if request.path != "/global/event":
            return await routes(request)
        subscriptions += 1
        if subscriptions == 1:
            await asyncio.Event().wait()
        return Reply(stream.data[: -len(b"0\r\n\r\n")], "hang")

    return respond


@pytest.mark.slow
async def test_event_subscription_the_upstream_never_answers_is_retried() -> None:
    async with proxy_in_front(_first_subscription_hangs(), connect_timeout=1.0) as proxy:
        deadline = time.monotonic() + 6  # a retry after a 1 s header wait needs far less
        while (await get(proxy.with_path("/_settle/health")))[2].find(b'"source": "events"') < 0:
            assert time.monotonic() < deadline, "the proxy never followed /global/event"
            await asyncio.sleep(0.2)


async def test_an_event_stream_that_never_starts_is_a_504_so_the_client_reconnects(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("proxy.opencode.routes.STREAM_START_TIMEOUT_S", 0.5)
    async with proxy_in_front(_never) as proxy:
        status, _, body = await get(proxy.with_path("/event"))
    assert status == 504
    assert b"did not answer within 0.5s" in body


async def _session_stream_after(delay: float, request: Received) -> Reply:
    """A v2 session stream as 1.18.33 serves one: nothing at all until its first event."""
    if not request.target.endswith("/event"):
        return Reply(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
    await asyncio.sleep(delay)
    event = b'data: {"type":"session.next.prompted"}\n\n'
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n" % len(event)
    return Reply(head + event, "close")


async def test_a_session_stream_may_wait_for_its_first_event(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("proxy.opencode.routes.STREAM_START_TIMEOUT_S", TIMEOUT_S)
    responder = functools.partial(_session_stream_after, 3 * TIMEOUT_S)
    async with proxy_in_front(responder, response_timeout=TIMEOUT_S) as proxy:
        status, _, body = await get(proxy.with_path("/api/session/ses_x/event"))
    assert status == 200
    assert body == b'data: {"type":"session.next.prompted"}\n\n'
