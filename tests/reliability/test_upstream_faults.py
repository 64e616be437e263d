"""Upstream faults against fakes: malformed or dying responses, a WebSocket dropped, an upstream
that is down when the proxy starts. (Hanging and slow upstreams are in `test_upstream_timeouts`;
the real server killed mid-request, mid-stream and mid-WebSocket is in
`tests/integration/test_faults.py`.)

The rule under test: whatever the upstream does, a client gets either the upstream's answer, a
JSON error (502) or, once a body has started, a connection that ends visibly short.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from yarl import URL

from proxy.service.app import create_app
from proxy.service.config import Settings
from tests.integration.http_client import free_port
from tests.reliability.faulty_upstreams import (
    CLIENT_TIMEOUT,
    MESSAGES,
    PLAIN,
    always,
    assert_json_error,
    assert_still_serves,
    get,
    proxy_in_front,
    proxy_in_front_of_streams,
)
from tests.reliability.load_upstream import LoadUpstream
from tests.reliability.raw_upstream import Reply, opencode_routes, raw_upstream
from tests.reliability.servers import proxy_subprocess, serve

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
        await assert_json_error(proxy.with_path(path), 502, "bad_gateway")
        await assert_still_serves(proxy)


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
        await assert_json_error(proxy.with_path(MESSAGES), 502, "bad_gateway")


@pytest.mark.parametrize("head", BROKEN_BODIES.values(), ids=BROKEN_BODIES.keys())
async def test_upstream_dying_mid_body_of_a_stream_isnever_a_complete_answer(head: bytes) -> None:
    """A streamed body whose failure shows before the status went out is a 502; after, the client
    must see the body cut short, never a 200 that looks complete."""
    async with proxy_in_front(opencode_routes(always(Reply(head, "close")))) as proxy:
        try:
            status, _, body = await get(proxy.with_path(PLAIN))
        except aiohttp.ClientPayloadError:
            pass
        else:
            assert status == 502, f"a broken body arrived as a complete {status}: {body!r}"
        await assert_still_serves(proxy)


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
        assert await _poll_status(proxy.url.with_path("/_settle/up"), 503, within=5) == {"status": "down"}
        await assert_json_error(proxy.url.with_path("/small"), 502, "bad_gateway")
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
        await assert_still_serves(proxy)


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
