from collections.abc import Awaitable, Callable

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from yarl import URL

from proxy.service.app import create_app
from proxy.service.config import Settings
from tests.proxy.addons.live_streams import GRACE_S, MESSAGE, V1
from tests.proxy.conftest import ProxyClient, following
from tests.proxy.fake_opencode import FakeOpencode


@pytest.fixture
async def live_proxy(
    upstream: TestServer,
    aiohttp_client: Callable[[web.Application], Awaitable[ProxyClient]],
    fake: FakeOpencode,
) -> ProxyClient:
    """A whole proxy in front of the fake, following its stream, with a short grace period; the
    fake serves the stale message a live settle confirms."""
    fake.bodies[f"/session/{V1}/message/{MESSAGE['info']['id']}"] = orjson.dumps(MESSAGE)
    client = await aiohttp_client(
        create_app(Settings(upstream=URL(str(upstream.make_url("/"))), grace=GRACE_S))
    )
    await following(client)
    return client
