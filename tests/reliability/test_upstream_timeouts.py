"""Slow and hanging upstreams against fakes: plain exchanges are bounded by the proxy's timeouts
(a JSON 504, or a body cut short once it started), a slow liveness look-up passes the body on
unchanged in time, and streams are never bounded once they have started.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable

import aiohttp
import pytest

from proxy.addons.settle import SETTLED_HEADER
from tests.fixtures import compact
from tests.reliability.faulty_upstreams import (
    CLIENT_TIMEOUT,
    MESSAGES,
    PLAIN,
    always,
    assert_json_error,
    get,
    never,
    proxy_in_front,
    proxy_in_front_of_streams,
)
from tests.reliability.raw_upstream import Received, Reply, Responder, json_reply, opencode_routes, response

TIMEOUT_S = 0.5
"""The response and liveness timeouts the timing tests give the proxy."""
SLACK_S = 4.0
"""Scheduling delay allowed on a busy machine: bounded means well under the client's 20 s."""


async def _timed(call: Awaitable[None]) -> float:
    started = time.monotonic()
    await call
    return time.monotonic() - started


@pytest.mark.parametrize("path", [PLAIN, MESSAGES])
async def test_hanging_upstream_is_a_json_504_after_the_response_timeout(path: str) -> None:
    async with proxy_in_front(opencode_routes(never), response_timeout=TIMEOUT_S) as proxy:
        took = await _timed(assert_json_error(proxy.with_path(path), 504, "gateway_timeout"))
    assert TIMEOUT_S <= took < TIMEOUT_S + SLACK_S


def _stalls_after(head: bytes) -> Responder:
    return opencode_routes(always(Reply(head, "hang")))


async def test_body_stalling_after_the_headers_is_bounded_too() -> None:
    """The timeout covers each wait for the upstream, not only the one for its headers."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n" + b'{"data":['
    async with proxy_in_front(_stalls_after(head), response_timeout=TIMEOUT_S) as proxy:
        took = await _timed(assert_json_error(proxy.with_path(MESSAGES), 504, "gateway_timeout"))
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
async def test_event_subscription_the_upstreamnever_answers_is_retried() -> None:
    async with proxy_in_front(_first_subscription_hangs(), connect_timeout=1.0) as proxy:
        deadline = time.monotonic() + 6  # a retry after a 1 s header wait needs far less
        while (await get(proxy.with_path("/_settle/health")))[2].find(b'"source": "events"') < 0:
            assert time.monotonic() < deadline, "the proxy never followed /global/event"
            await asyncio.sleep(0.2)


async def test_an_event_stream_thatnever_starts_is_a_504_so_the_client_reconnects(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("proxy.opencode.routes.STREAM_START_TIMEOUT_S", 0.5)
    async with proxy_in_front(never) as proxy:
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
    responder = opencode_routes(functools.partial(_session_stream_after, 3 * TIMEOUT_S))
    async with proxy_in_front(responder, response_timeout=TIMEOUT_S) as proxy:
        status, _, body = await get(proxy.with_path("/api/session/ses_x/event"))
    assert status == 200
    assert body == b'data: {"type":"session.next.prompted"}\n\n'


async def _booting_server(request: Received) -> Reply:
    """A server that took the connection and has not answered yet (a from-source 2.x build, for
    about 2 s after its port opened, never answered what it took then): its health never
    answers, a GET never does, and a POST answers after a pause longer than the bound."""
    if request.method == "POST":
        await asyncio.sleep(3 * TIMEOUT_S)
        return json_reply({"id": "ses_1"})
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


async def test_a_get_the_booting_server_took_and_never_answers_is_a_504_and_a_post_waits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("proxy.opencode.routes.STREAM_START_TIMEOUT_S", TIMEOUT_S)
    async with proxy_in_front(_booting_server) as proxy:
        status, _, body = await get(proxy.with_path("/api/session/active"))
        async with (
            aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as session,
            session.post(proxy.with_path("/session"), json={}) as answer,
        ):
            posted = answer.status, await answer.json()
    assert status == 504
    assert f"did not answer within {TIMEOUT_S:g}s".encode() in body
    assert posted == (200, {"id": "ses_1"}), "a POST is never cut short: its client cannot safely ask again"
