"""A plain `/event` (no directory asked: the SDK's default client) is told as its directory's stream."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from proxy.testing import idle
from tests.proxy.addons.live_streams import crash_with_part_open, events
from tests.proxy.conftest import ProxyClient, crash, ends_with_nothing_more, injected
from tests.proxy.fake_opencode import FakeOpencode

TOLD = ["message.part.updated", "message.updated", "session.status", "session.idle"]
"""What a stream open through a live settlement is told; one opened later gets all but the idle."""


async def kinds(stream: AsyncIterator[Any], count: int) -> list[str]:
    return [(await anext(stream))["type"] for _ in range(count)]


def path_requests(fake: FakeOpencode) -> int:
    return sum(1 for request in fake.seen if request.path == "/path")


async def test_a_plain_event_stream_open_through_the_crash_is_told(
    live_proxy: ProxyClient, fake: FakeOpencode
) -> None:
    stream = events(await live_proxy.get("/event"))  # the fake's `/event` outlives its crash
    assert await kinds(stream, 1) == ["server.connected"]
    await crash_with_part_open(live_proxy, fake)
    assert await kinds(stream, 4) == TOLD


async def test_a_plain_event_stream_opened_later_gets_the_state(
    live_proxy: ProxyClient, fake: FakeOpencode
) -> None:
    await crash_with_part_open(live_proxy, fake)
    await idle(live_proxy.app)
    stream = events(await live_proxy.get("/event"))
    assert await kinds(stream, 4) == ["server.connected", *TOLD[:-1]]


async def test_the_default_directory_is_asked_again_after_every_restart(
    live_proxy: ProxyClient, fake: FakeOpencode
) -> None:
    await idle(live_proxy.app)
    assert path_requests(fake) == 1
    fake.default_directory = "/elsewhere"  # the restarted server runs in another directory
    await crash_with_part_open(live_proxy, fake)
    await idle(live_proxy.app)
    assert path_requests(fake) == 2
    plain = await live_proxy.get("/event")
    own = await live_proxy.get("/event", params={"directory": "/cwd"})
    assert await kinds(events(own), 2) == ["server.connected", "message.part.updated"]
    first = await asyncio.wait_for(plain.content.readuntil(b"\n\n"), 5)
    assert first.startswith(b'data: {"type":"server.connected"')
    await ends_with_nothing_more(fake, plain)  # /cwd's session is none of the default instance's business now
    assert await injected(live_proxy) == 3  # `own`'s, not `plain`'s


async def test_a_plain_event_stream_waits_while_the_default_directory_is_unknown(
    live_proxy: ProxyClient, fake: FakeOpencode, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="proxy.addons")
    fake.path_fails = True
    await crash(live_proxy, fake)  # asked again, and the server does not answer
    await idle(live_proxy.app)
    assert "the server's default directory is unknown" in caplog.text
    stream = events(await live_proxy.get("/event"))
    assert await kinds(stream, 1) == ["server.connected"]
    assert "it is told nothing until that is learned" in caplog.text
    fake.path_fails = False
    await crash_with_part_open(live_proxy, fake)
    assert await kinds(stream, 4) == TOLD
    assert "follow the server's default directory /cwd" in caplog.text


async def test_a_plain_event_stream_asks_again_once_the_proxy_gave_up(
    live_proxy: ProxyClient, fake: FakeOpencode, caplog: pytest.LogCaptureFixture
) -> None:
    """The server did not answer after a restart, and the proxy gave up: the next plain `/event`
    asks again (with its own credentials, the client's), and is told from then on."""
    caplog.set_level(logging.INFO, logger="proxy.addons")
    fake.path_fails = True
    await crash_with_part_open(live_proxy, fake)
    await idle(live_proxy.app)
    assert "the server's default directory is unknown" in caplog.text
    fake.path_fails = False
    stream = events(await live_proxy.get("/event"))
    assert await kinds(stream, 4) == ["server.connected", *TOLD[:-1]]
    assert {"directory": "/cwd", "waiting": 1} in [
        getattr(record, "fields", None) for record in caplog.records
    ]
