import asyncio
from collections.abc import Awaitable, Callable

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from yarl import URL

from proxy.opencode.tracker import TRACKER, StreamState
from proxy.service.app import create_app
from proxy.service.config import Settings
from tests.proxy.fake_opencode import FakeOpencode

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
async def proxy(
    upstream: TestServer, aiohttp_client: Callable[[web.Application], Awaitable[ProxyClient]]
) -> ProxyClient:
    return await aiohttp_client(create_app(Settings(upstream=URL(str(upstream.make_url("/"))))))


async def following(proxy: ProxyClient) -> None:
    """Wait (bounded) until the proxy follows the fake's `/global/event`."""
    for _ in range(300):
        if proxy.app[TRACKER].state is StreamState.FOLLOWING:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the proxy never followed /global/event")
