from collections.abc import Awaitable, Callable

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from yarl import URL

from proxy.service.app import create_app
from proxy.service.config import Settings, WriteBackMode
from tests.proxy.conftest import ProxyClient


@pytest.fixture
async def write_back_proxy(
    upstream: TestServer, aiohttp_client: Callable[[web.Application], Awaitable[ProxyClient]]
) -> ProxyClient:
    """A whole proxy in front of the fake that writes settlements back through its API, after a
    short grace period."""
    settings = Settings(upstream=URL(str(upstream.make_url("/"))), write_back=WriteBackMode.API, grace=0.05)
    return await aiohttp_client(create_app(settings))
