"""A plain `/event` (no directory asked: the SDK's default client) is told as its directory's stream."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from yarl import URL

from proxy.service.app import create_app
from proxy.service.config import Settings
from proxy.testing import idle
from tests.fixtures import load
from tests.proxy.conftest import ProxyClient, crash, ends_with_nothing_more, following, injected, publish
from tests.proxy.fake_opencode import FakeOpencode

V1 = "ses_dd6bcdaa7ffenxavFWr4GKPq95"
MESSAGE = load("v1-message-stale-running.json")[1]
PART = MESSAGE["parts"][1]
ClientFactory = Callable[[web.Application], Awaitable[ProxyClient]]


@pytest.fixture
async def proxy(upstream: TestServer, aiohttp_client: ClientFactory, fake: FakeOpencode) -> ProxyClient:
    fake.bodies[f"/session/{V1}/message/{MESSAGE['info']['id']}"] = orjson.dumps(MESSAGE)
    client = await aiohttp_client(create_app(Settings(upstream=URL(str(upstream.make_url("/"))), grace=0.05)))
    await following(client)
    return client


async def events(response: aiohttp.ClientResponse) -> AsyncIterator[Any]:
    while line := await asyncio.wait_for(response.content.readline(), 5):
        if line.startswith(b"data: "):
            yield orjson.loads(line[6:])


async def kinds(stream: AsyncIterator[Any], count: int) -> list[str]:
    return [(await anext(stream))["type"] for _ in range(count)]


async def crash_with_part_open(proxy: ProxyClient, fake: FakeOpencode) -> None:
    await publish(proxy, fake, "message.part.updated", V1, part=PART, time=1)
    await crash(proxy, fake)


def path_requests(fake: FakeOpencode) -> int:
    return sum(1 for request in fake.seen if request.path == "/path")


async def test_a_plain_event_stream_open_through_the_crash_is_told(
    proxy: ProxyClient, fake: FakeOpencode
) -> None:
    stream = events(await proxy.get("/event"))  # the fake's `/event` outlives its crash
    assert await kinds(stream, 1) == ["server.connected"]
    await crash_with_part_open(proxy, fake)
    assert await kinds(stream, 4) == [
        "message.part.updated",
        "message.updated",
        "session.status",
        "session.idle",
    ]


async def test_a_plain_event_stream_opened_later_gets_the_state(
    proxy: ProxyClient, fake: FakeOpencode
) -> None:
    await crash_with_part_open(proxy, fake)
    await idle(proxy.app)
    stream = events(await proxy.get("/event"))
    assert await kinds(stream, 4) == [
        "server.connected",
        "message.part.updated",
        "message.updated",
        "session.status",
    ]


async def test_the_default_directory_is_asked_again_after_every_restart(
    proxy: ProxyClient, fake: FakeOpencode
) -> None:
    await idle(proxy.app)
    assert path_requests(fake) == 1
    fake.default_directory = "/elsewhere"  # the restarted server runs in another directory
    await crash_with_part_open(proxy, fake)
    await idle(proxy.app)
    assert path_requests(fake) == 2
    plain = await proxy.get("/event")
    own = await proxy.get("/event", params={"directory": "/cwd"})
    assert await kinds(events(own), 2) == ["server.connected", "message.part.updated"]
    first = await asyncio.wait_for(plain.content.readuntil(b"\n\n"), 5)
    assert first.startswith(b'data: {"type":"server.connected"')
    await ends_with_nothing_more(fake, plain)  # /cwd's session is none of the default instance's business now
    assert await injected(proxy) == 3  # `own`'s, not `plain`'s


async def test_a_plain_event_stream_waits_while_the_default_directory_is_unknown(
    proxy: ProxyClient, fake: FakeOpencode, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="proxy.addons")
    fake.path_fails = True
    await crash(proxy, fake)  # asked again, and the server does not answer
    await idle(proxy.app)
    assert "the server's default directory is unknown" in caplog.text
    stream = events(await proxy.get("/event"))
    assert await kinds(stream, 1) == ["server.connected"]
    assert "it is told nothing until that is learned" in caplog.text
    fake.path_fails = False
    await crash_with_part_open(proxy, fake)
    assert await kinds(stream, 4) == [
        "message.part.updated",
        "message.updated",
        "session.status",
        "session.idle",
    ]
    assert "follow the server's default directory /cwd" in caplog.text


async def test_a_plain_event_stream_asks_again_once_the_proxy_gave_up(
    proxy: ProxyClient, fake: FakeOpencode, caplog: pytest.LogCaptureFixture
) -> None:
    """The server did not answer after a restart, and the proxy gave up: the next plain `/event`
    asks again (with its own credentials, the client's), and is told from then on."""
    caplog.set_level(logging.INFO, logger="proxy.addons")
    fake.path_fails = True
    await crash_with_part_open(proxy, fake)
    await idle(proxy.app)
    assert "the server's default directory is unknown" in caplog.text
    fake.path_fails = False
    stream = events(await proxy.get("/event"))
    assert await kinds(stream, 4) == [
        "server.connected",
        "message.part.updated",
        "message.updated",
        "session.status",
    ]
    assert {"directory": "/cwd", "waiting": 1} in [
        getattr(record, "fields", None) for record in caplog.records
    ]
