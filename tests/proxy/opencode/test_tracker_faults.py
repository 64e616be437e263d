"""No event stops liveness: an unreadable one is skipped, a failing listener is isolated, and
following that fails anyway is started again from nothing, with health saying so."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from yarl import URL

from proxy.opencode import tracker as tracker_module
from proxy.opencode.tracker import (
    FollowedEvent,
    LivenessTracker,
    StreamListener,
    StreamMetrics,
    StreamState,
)
from proxy.service.app import ASSEMBLY
from proxy.supervision.server_command import free_loopback_port
from proxy.testing import WAIT_S, hearing, refollowing
from rules import Api
from tests.fixtures import js_json
from tests.proxy.conftest import ProxyClient, following, publish
from tests.proxy.fake_opencode import FakeOpencode

V1 = "ses_dd6bcdaa7ffenxavFWr4GKPq95"
OTHER = "ses_other"


def samples(metrics: StreamMetrics | None, name: str, labels: dict[str, str] | None = None) -> float:
    assert metrics is not None
    counter = {"unreadable": metrics.unreadable_events, "listener": metrics.listener_errors}[name]
    return sum(
        sample.value
        for metric in counter.collect()
        for sample in metric.samples
        if sample.name.endswith("_total")
        and all(sample.labels.get(k) == v for k, v in (labels or {}).items())
    )


def nested(depth: int) -> bytes:
    """A `message.part.updated` whose tool input is nested `depth` levels deep (a model can write one)."""
    inner = b"[" * depth + b"]" * depth
    return (
        b'{"directory":"/cwd","payload":{"type":"message.part.updated","properties":{"sessionID":"'
        + V1.encode()
        + b'","part":{"type":"tool","state":{"input":{"x":'
        + inner
        + b"}}}}}}"
    )


def big_output(size: int) -> bytes:
    part = {
        "id": "prt_big",
        "type": "tool",
        "sessionID": V1,
        "state": {"status": "completed", "output": "x" * size},
    }
    return js_json(
        {
            "directory": "/cwd",
            "payload": {"type": "message.part.updated", "properties": {"sessionID": V1, "part": part}},
        }
    )


async def kept_busy(proxy: ProxyClient, fake: FakeOpencode) -> LivenessTracker:
    await following(proxy)
    await publish(proxy, fake, "session.status", V1, status={"type": "busy"})
    tracker = proxy.app[ASSEMBLY].started.tracker
    kept = tracker.cached(Api.V1, V1)
    assert kept is not None
    assert kept.liveness.active
    return tracker


def send_raw(fake: FakeOpencode, payload: bytes) -> None:
    for queue in fake.streams:
        queue.put_nowait(payload)


async def test_an_event_nested_past_the_decoders_depth_is_skipped_and_following_goes_on(
    proxy: ProxyClient, fake: FakeOpencode, caplog: pytest.LogCaptureFixture
) -> None:
    tracker = await kept_busy(proxy, fake)
    async with hearing(proxy.app, "session.status", OTHER):
        send_raw(fake, nested(5000))
        send_raw(fake, nested(5000))
        fake.publish("session.status", OTHER, status={"type": "busy"})
    assert tracker.state is StreamState.FOLLOWING
    assert tracker.cached(Api.V1, V1) is None, "the skipped event may have been about it: asked again"
    assert samples(tracker._metrics, "unreadable", {"reason": "RecursionError"}) == 2
    skipped = [record for record in caplog.records if "was skipped" in record.getMessage()]
    assert len(skipped) == 1, "said once, counted every time"
    health = await (await proxy.get("/_settle/health")).json()
    assert health["liveness"]["event_stream"] == "following"
    text = await (await proxy.get("/_settle/metrics")).text()
    assert 'settle_proxy_unreadable_events_total{reason="RecursionError"} 2.0' in text


async def test_an_event_line_past_aiohttps_line_limit_is_read(proxy: ProxyClient, fake: FakeOpencode) -> None:
    tracker = await kept_busy(proxy, fake)
    async with hearing(proxy.app, "message.part.updated", V1):
        send_raw(fake, big_output(600 * 1024))  # a large tool output: past aiohttp's 512 KiB readline
    assert tracker.state is StreamState.FOLLOWING
    await publish(proxy, fake, "session.status", OTHER, status={"type": "busy"})


class Noting(StreamListener):
    def __init__(self) -> None:
        self.events: list[FollowedEvent] = []
        self.followed = asyncio.Event()
        self.heard = asyncio.Event()

    def following(self) -> None:
        self.followed.set()

    def event(self, event: FollowedEvent) -> None:
        self.events.append(event)
        if event.kind == "session.status":
            self.heard.set()


class Raising(StreamListener):
    name = "raising"

    def following(self) -> None:
        raise RuntimeError("listener bug in following")

    def event(self, event: FollowedEvent) -> None:
        raise RuntimeError("listener bug in event")


@pytest.fixture
async def upstream_url(aiohttp_server: Any, fake: FakeOpencode) -> URL:
    return URL(str((await aiohttp_server(fake.app())).make_url("/")))


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def running(tracker: LivenessTracker) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(tracker.run())
    try:
        yield task
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def wait(event: asyncio.Event) -> None:
    async with asyncio.timeout(WAIT_S):
        await event.wait()


async def test_a_line_past_the_limit_is_skipped_and_the_next_one_read(
    client: aiohttp.ClientSession, upstream_url: URL, fake: FakeOpencode
) -> None:
    metrics = StreamMetrics.unregistered()
    tracker = LivenessTracker(client, upstream_url, metrics=metrics, line_limit=4096)
    noting = Noting()
    tracker.listeners.append(noting)
    async for _ in running(tracker):
        await wait(noting.followed)
        send_raw(fake, big_output(100_000))
        fake.publish("session.status", V1, status={"type": "busy"})
        await wait(noting.heard)
        assert [event.kind for event in noting.events] == ["server.connected", "session.status"]
        assert samples(metrics, "unreadable", {"reason": "too long"}) == 1
        assert tracker.state is StreamState.FOLLOWING


async def test_a_listener_that_raises_is_isolated(
    client: aiohttp.ClientSession, upstream_url: URL, fake: FakeOpencode, caplog: pytest.LogCaptureFixture
) -> None:
    metrics = StreamMetrics.unregistered()
    tracker = LivenessTracker(client, upstream_url, metrics=metrics)
    noting = Noting()
    tracker.listeners += [Raising(), noting]
    async for _ in running(tracker):
        await wait(noting.followed)
        fake.publish("session.status", V1, status={"type": "busy"})
        await wait(noting.heard)
        kept = tracker.cached(Api.V1, V1)
        assert kept is not None
        assert kept.liveness.active
    assert samples(metrics, "listener", {"listener": "raising", "hook": "following"}) == 1
    assert samples(metrics, "listener", {"listener": "raising", "hook": "event"}) == 2  # connected, status
    assert any("stream listener raising failed in event" in record.getMessage() for record in caplog.records)


async def test_following_that_fails_drops_what_is_kept_says_so_and_starts_again(
    proxy: ProxyClient, fake: FakeOpencode, monkeypatch: pytest.MonkeyPatch
) -> None:
    tracker = await kept_busy(proxy, fake)
    meaning, faults = tracker_module.liveness_meaning, [RuntimeError("a bug in the tracker")]

    def failing(event: FollowedEvent) -> Any:
        if faults:
            raise faults.pop()
        return meaning(event)

    monkeypatch.setattr(tracker_module, "liveness_meaning", failing)
    async with refollowing(proxy.app):
        fake.publish("session.status", OTHER, status={"type": "idle"})
    assert tracker.cached(Api.V1, V1) is None, "the kept busy is gone with the failed task"
    assert fake.subscribers == 2
    health = await (await proxy.get("/_settle/health")).json()
    assert health["liveness"]["restarts"] == 1
    assert health["liveness"]["last_failure"] == "RuntimeError: a bug in the tracker"
    text = await (await proxy.get("/_settle/metrics")).text()
    assert "settle_proxy_event_stream_restarts_total 1.0" in text


async def test_the_server_that_opens_late_is_waited_for_and_said_so_once(
    client: aiohttp.ClientSession, fake: FakeOpencode, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="proxy.opencode.tracker")
    port = free_loopback_port()
    refused = asyncio.Event()
    attempts: list[BaseException] = []

    async def on_exception(_: Any, __: Any, params: aiohttp.TraceRequestExceptionParams) -> None:
        attempts.append(params.exception)
        if len(attempts) >= 4:
            refused.set()

    trace = aiohttp.TraceConfig()
    trace.on_request_exception.append(on_exception)
    runner = web.AppRunner(fake.app())
    await runner.setup()
    async with aiohttp.ClientSession(trace_configs=[trace]) as traced:
        tracker = LivenessTracker(traced, URL(f"http://127.0.0.1:{port}"))
        noting = Noting()
        tracker.listeners.append(noting)
        try:
            async for _ in running(tracker):
                await wait(refused)  # four connections refused while the "server" is still starting
                await web.TCPSite(runner, "127.0.0.1", port).start()
                await wait(noting.followed)
                said = [record.getMessage() for record in caplog.records]
                assert [line for line in said if "waiting for the server" in line] == [
                    f"waiting for the server to answer /global/event ({attempts[0]})"
                ]
                assert not [line for line in said if "lost" in line]
                noting.followed.clear()
                fake.drop_streams()
                await wait(noting.followed)
                lost = [record.getMessage() for record in caplog.records if "lost" in record.getMessage()]
                assert lost == ["event stream /global/event lost: the server ended it"]
        finally:
            fake.drop_streams()
            await runner.cleanup()
