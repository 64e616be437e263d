import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from yarl import URL

from proxy.addons.context import SettleContext
from proxy.addons.settle import Settle
from proxy.opencode.client import UpstreamApi
from proxy.opencode.liveness import LivenessProbe
from proxy.opencode.surveys import OtherProcesses
from proxy.opencode.tracker import LivenessTracker, StreamState
from proxy.service.app import ASSEMBLY, create_app
from proxy.service.config import Settings
from proxy.service.metrics import Metrics
from proxy.supervision.server_command import free_loopback_port
from proxy.testing import WAIT_S, hearing, refollowing
from proxy.writeback.scheduler import WriteBack
from tests.proxy.fake_opencode import FakeOpencode
from tests.proxy.system.fake_proc import FakeProc

ProxyClient = TestClient[web.Request, web.Application]


@pytest.fixture
def fake() -> FakeOpencode:
    return FakeOpencode()


@pytest.fixture
async def upstream(
    fake: FakeOpencode, aiohttp_server: Callable[[web.Application], Awaitable[TestServer]]
) -> TestServer:
    return await aiohttp_server(fake.app())


@pytest.fixture
async def upstream_api(upstream: TestServer) -> AsyncIterator[UpstreamApi]:
    """A client of the fake, for addons and writers built without an application."""
    async with aiohttp.ClientSession() as session:
        yield UpstreamApi(session, URL(str(upstream.make_url("/"))))


@pytest.fixture
def proc(tmp_path: Path) -> FakeProc:
    """An empty fake `/proc` in which the upstream listens on `fake_proc.PORT`."""
    return FakeProc(tmp_path / "proc")


@pytest.fixture
async def proxy(
    upstream: TestServer, aiohttp_client: Callable[[web.Application], Awaitable[ProxyClient]]
) -> ProxyClient:
    return await aiohttp_client(create_app(Settings(upstream=URL(str(upstream.make_url("/"))))))


@asynccontextmanager
async def asking_settle(
    upstream_api: UpstreamApi, elsewhere: OtherProcesses | None = None, write_back: WriteBack | None = None
) -> AsyncIterator[Settle]:
    """The settle addon as the application builds it, asking the fake upstream for liveness (its
    tracker is never run, so it follows no stream and every reading is asked), bounded by the
    other processes on the database when `elsewhere` is given; it schedules its settlements on
    `write_back`, if given."""
    async with aiohttp.ClientSession() as session:
        tracker = LivenessTracker(session, URL("http://127.0.0.1:1"))
        probe = LivenessProbe(upstream_api, elsewhere=elsewhere)
        context = SettleContext(probe, upstream_api, Metrics(), grace=0, write_back=write_back)
        yield Settle(context, tracker=tracker)


async def following(proxy: ProxyClient) -> None:
    """Wait (bounded) until the proxy follows the fake's `/global/event`."""
    if proxy.app[ASSEMBLY].started.tracker.state is not StreamState.FOLLOWING:
        async with refollowing(proxy.app):
            pass


async def publish(
    proxy: ProxyClient, fake: FakeOpencode, kind: str, session_id: str, **properties: Any
) -> None:
    """Send an event on the fake's `/global/event` and wait until the proxy's listeners have it."""
    async with hearing(proxy.app, kind, session_id):
        fake.publish(kind, session_id, **properties)


async def injected(proxy: ProxyClient) -> float:
    """How many events the proxy has slipped into client streams (its counter: each is counted as
    it is queued, so this is final once the background is idle)."""
    text = await (await proxy.get("/_settle/metrics")).text()
    (line,) = [line for line in text.splitlines() if line.startswith("settle_proxy_injected_events_total")]
    return float(line.split()[-1])


MARKER_SESSION = "ses_marker"
"""A session no test is about: the subject of the server's marker event (`next_is_the_servers`)."""


async def next_is_the_servers(fake: FakeOpencode, stream: AsyncIterator[Any]) -> None:
    """The next event a client's `/global/event` stream gets is the one the server sends now: the
    proxy slipped nothing in before it. A positive signal, where a pause could be too short."""
    fake.publish("server.heartbeat", MARKER_SESSION)
    marker = {"type": "server.heartbeat", "properties": {"sessionID": MARKER_SESSION}}
    event = await anext(stream)
    assert event["payload"] == marker, event


async def ends_with_nothing_more(fake: FakeOpencode, response: aiohttp.ClientResponse) -> None:
    """The server ends a quiet instance stream (`/event`); the client gets nothing more before its end."""
    fake.release.set()
    assert await asyncio.wait_for(response.content.read(), WAIT_S) == b""


async def crash(proxy: ProxyClient, fake: FakeOpencode) -> None:
    """End the fake's `/global/event` streams, as a crashing server does, and wait until the
    proxy follows it again."""
    async with refollowing(proxy.app):
        fake.drop_streams()


async def answering(client: aiohttp.ClientSession, url: str) -> None:
    """Wait (bounded) until a proxy process just started answers `url`: another process tells
    this one nothing, so it is asked again until it answers."""
    for _ in range(200):
        try:
            async with client.get(url):
                return
        except aiohttp.ClientConnectionError:
            await asyncio.sleep(0.05)
    raise AssertionError(f"{url} never answered")


def settle_proxy(*args: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`settle-proxy ARGS` run to its end as users run it (with `env` added to the environment),
    its output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "proxy", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **(env or {})},
    )


@asynccontextmanager
async def proxy_process(
    upstream: TestServer | URL, log: Path, *flags: str, env: Mapping[str, str] | None = None
) -> AsyncIterator[URL]:
    """`settle-proxy --upstream UPSTREAM FLAGS` on a free loopback port, answering once the block
    starts, its stdout and stderr in `log`; terminated when the block ends."""
    port = free_loopback_port()
    origin = str(upstream.make_url("/") if isinstance(upstream, TestServer) else upstream)
    with log.open("wb") as output:
        process = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "proxy", "--upstream", origin, "--port", str(port)),
            *flags,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    base = URL(f"http://127.0.0.1:{port}")
    try:
        async with aiohttp.ClientSession() as client:
            await answering(client, str(base.with_path("/_settle/health")))
        yield base
    finally:
        process.terminate()
        await asyncio.wait_for(process.wait(), timeout=10)
