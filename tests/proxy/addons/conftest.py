from collections.abc import AsyncIterator, Awaitable, Callable

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from yarl import URL

from proxy.addons.context import SettleContext
from proxy.addons.live.addon import LiveSettle
from proxy.addons.settle import Settle
from proxy.opencode.client import UpstreamApi
from proxy.opencode.liveness import LivenessProbe
from proxy.service.app import create_app
from proxy.service.config import Settings
from proxy.service.metrics import Metrics
from tests.proxy.addons.live_streams import GRACE_S, MESSAGE, V1, WRITING
from tests.proxy.conftest import ProxyClient, asking_settle, following
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


@pytest.fixture
async def settle(upstream_api: UpstreamApi) -> AsyncIterator[Settle]:
    async with asking_settle(upstream_api) as addon:
        yield addon


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


@pytest.fixture
def live(upstream_api: UpstreamApi, fake: FakeOpencode, metrics: Metrics) -> LiveSettle:
    """The live-settle addon as the application builds it, the fake its upstream, with a short
    grace period; the fake serves the stale message and the one cut while it was written."""
    fake.bodies[f"/session/{V1}/message/{MESSAGE['info']['id']}"] = orjson.dumps(MESSAGE)
    fake.bodies[f"/session/{V1}/message/{WRITING['info']['id']}"] = orjson.dumps(WRITING)
    return LiveSettle(SettleContext(LivenessProbe(upstream_api), upstream_api, metrics, grace=GRACE_S))
