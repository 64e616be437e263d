"""A plain `/event` (no directory asked: the SDK's default client) is told as its directory's stream:
once end to end through a whole proxy, and otherwise the live-settle addon at its interfaces
(the followed stream's events handed to it, client streams as flows, the fake answering `/path`)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from proxy import testing
from proxy.addons.context import SettleContext
from proxy.addons.live.addon import LiveSettle
from proxy.opencode.client import UpstreamApi
from proxy.opencode.dialects import LINE_2X
from proxy.opencode.liveness import LivenessProbe
from proxy.opencode.server_line import KnownServer, ServerLine
from proxy.relay.hooks import Flow
from proxy.service.metrics import Metrics
from tests.proxy.addons import test_live_hooks as hooks
from tests.proxy.addons.live_streams import crash_with_part_open, events
from tests.proxy.conftest import ProxyClient
from tests.proxy.fake_opencode import FakeOpencode

TOLD = ["message.part.updated", "message.updated", "session.status", "session.idle"]
"""What a stream open at the crash is told."""
REPLAYED = ["message.updated", "message.part.updated", "session.status"]
"""What a stream that opens later is replayed: a message before its parts."""
"""What a stream open through a live settlement is told; one opened later gets all but the idle."""


async def kinds(stream: AsyncIterator[Any], count: int) -> list[str]:
    return [(await anext(stream))["type"] for _ in range(count)]


def queued(flow: Flow) -> list[str]:
    """The kinds of the events queued for a client stream so far."""
    assert flow.injected is not None
    frames = [flow.injected.get_nowait() for _ in range(flow.injected.qsize())]
    return [orjson.loads(frame.removeprefix(b"data: "))["type"] for frame in frames]


def plain_event(query: str = "") -> Flow:
    return testing.flow("GET", f"/event{query}", response_headers=hooks.SSE)


def path_requests(fake: FakeOpencode) -> int:
    return sum(1 for request in fake.seen if request.path == "/path")


async def followed(live: LiveSettle) -> None:
    """The proxy follows the server's stream (as at start-up) and has asked its default directory."""
    live.following()
    await live.tasks.idle()


async def test_a_plain_event_stream_open_through_the_crash_is_told(
    live_proxy: ProxyClient, fake: FakeOpencode
) -> None:
    stream = events(await live_proxy.get("/event"))  # the fake's `/event` outlives its crash
    assert await kinds(stream, 1) == ["server.connected"]
    await crash_with_part_open(live_proxy, fake)
    assert await kinds(stream, 4) == TOLD


async def test_a_plain_event_stream_opened_later_gets_the_state(live: LiveSettle) -> None:
    await followed(live)
    hooks.crash_with_part_open(live)
    await live.tasks.idle()
    async with testing.streaming(live, plain_event()) as flow:
        assert queued(flow) == REPLAYED


async def test_the_default_directory_is_asked_again_after_every_restart(
    live: LiveSettle, fake: FakeOpencode, metrics: Metrics
) -> None:
    await followed(live)
    assert path_requests(fake) == 1
    fake.default_directory = "/elsewhere"  # the restarted server runs in another directory
    hooks.crash_with_part_open(live)
    await live.tasks.idle()
    assert path_requests(fake) == 2
    async with (
        testing.streaming(live, plain_event()) as plain,
        testing.streaming(live, plain_event("?directory=/cwd")) as own,
    ):
        assert queued(own) == REPLAYED
        assert queued(plain) == []  # /cwd's session is none of the default instance's business now
    assert metrics.injected_events._value.get() == 3  # `own`'s, not `plain`'s


async def test_a_plain_event_stream_waits_while_the_default_directory_is_unknown(
    live: LiveSettle, fake: FakeOpencode, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="proxy.addons")
    fake.path_fails = True
    await followed(live)  # asked, and the server does not answer
    assert "the server's default directory is unknown" in caplog.text
    async with testing.streaming(live, plain_event()) as flow:
        assert "it is told nothing until that is learned" in caplog.text
        assert queued(flow) == []
        fake.path_fails = False
        hooks.crash_with_part_open(live)
        await live.tasks.idle()
        assert queued(flow) == TOLD
    assert "follow the server's default directory /cwd" in caplog.text


async def test_a_plain_event_stream_asks_again_once_the_proxy_gave_up(
    live: LiveSettle, fake: FakeOpencode, caplog: pytest.LogCaptureFixture
) -> None:
    """The server did not answer after a restart, and the proxy gave up: the next plain `/event`
    asks again (with its own credentials, the client's), and is told from then on."""
    caplog.set_level(logging.INFO, logger="proxy.addons")
    fake.path_fails = True
    hooks.crash_with_part_open(live)
    await live.tasks.idle()
    assert "the server's default directory is unknown" in caplog.text
    fake.path_fails = False
    async with testing.streaming(live, plain_event()) as flow:
        await live.tasks.idle()
        assert queued(flow) == REPLAYED
    assert {"directory": "/cwd", "waiting": 1} in [
        getattr(record, "fields", None) for record in caplog.records
    ]


async def test_a_2x_server_is_never_asked_for_the_default_directory(
    upstream_api: UpstreamApi, fake: FakeOpencode, metrics: Metrics, caplog: pytest.LogCaptureFixture
) -> None:
    """2.x has no `/path` and no plain `/event`: asking it would only log a 404 at each reconnect."""
    caplog.set_level(logging.INFO)
    line = ServerLine.told(KnownServer("2.0.0", LINE_2X, True, "(told)"))
    live = LiveSettle(SettleContext(LivenessProbe(upstream_api), upstream_api, metrics, grace=0), server=line)
    live.following()
    live.following()  # a reconnect
    await live.tasks.idle()
    assert path_requests(fake) == 0
    assert "plain /event streams are told nothing" not in caplog.text
