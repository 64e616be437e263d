import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from yarl import URL

from proxy import testing
from proxy.addons.settle import Settle
from proxy.opencode.client import UpstreamApi
from proxy.opencode.liveness import LivenessProbe
from proxy.service.app import create_app
from proxy.service.config import Settings
from proxy.writeback.api_writer import ApiWriter
from proxy.writeback.locks import SessionLocks
from proxy.writeback.modes import WriteBackMode
from proxy.writeback.scheduler import WriteBack
from tests.proxy.conftest import ProxyClient, asking_settle
from tests.proxy.fake_opencode import FakeOpencode


@pytest.fixture
async def write_back_proxy(
    upstream: TestServer, aiohttp_client: Callable[[web.Application], Awaitable[ProxyClient]]
) -> ProxyClient:
    """A whole proxy in front of the fake that writes settlements back through its API, after a
    short grace period."""
    settings = Settings(upstream=URL(str(upstream.make_url("/"))), write_back=WriteBackMode.API, grace=0.05)
    return await aiohttp_client(create_app(settings))


@pytest.fixture
async def write_back(upstream_api: UpstreamApi, tmp_path: Path) -> AsyncIterator[WriteBack]:
    """Write-back through the fake's API, after a short grace period, as a stand-alone proxy runs it."""
    scheduler = WriteBack(LivenessProbe(upstream_api), ApiWriter(upstream_api, SessionLocks(tmp_path)), 0.05)
    try:
        yield scheduler
    finally:
        await scheduler.close()


@pytest.fixture
async def asking(upstream_api: UpstreamApi, write_back: WriteBack) -> AsyncIterator[Settle]:
    """The settle addon, asking the fake for liveness, scheduling its settlements on `write_back`."""
    async with asking_settle(upstream_api, write_back=write_back) as settle:
        yield settle


@pytest.fixture
def shown(asking: Settle, write_back: WriteBack, fake: FakeOpencode) -> Callable[[str], Awaitable[Any]]:
    """`await shown(path)`: the fake's view at `path` as the settle addon shows it, once the
    write-back it scheduled is over (the addon through `proxy.testing`, not a whole proxy)."""

    async def show(path: str) -> Any:
        flow = await testing.cycle(asking, testing.flow("GET", path, body=fake.bodies[path]))
        await write_back.tasks.idle()
        return json.loads(flow.body)  # as a client reads it: a lone surrogate is not an error

    return show
