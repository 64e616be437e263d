"""The bench's fake opencode: the proxy must take it for the server it was built against, or it
would follow no events and settle nothing, and its figures would not be the proxy's at work."""

from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from yarl import URL

from bench import shapes
from bench.fake_upstream import Upstream
from proxy.opencode.client import Credentials, UpstreamApi
from proxy.opencode.dialects import LINE_1_18
from proxy.opencode.server_line import ServerLine


@pytest.fixture
async def upstream_api(
    aiohttp_server: Callable[[web.Application], Awaitable[TestServer]],
) -> AsyncIterator[UpstreamApi]:
    server = await aiohttp_server(Upstream(shapes.FIXTURES, [10]).app())
    async with aiohttp.ClientSession() as session:
        yield UpstreamApi(session, URL(str(server.make_url("/"))))


async def test_the_proxy_knows_the_fake_upstream_as_opencode_1_18(upstream_api: UpstreamApi) -> None:
    known = await ServerLine(upstream_api, Credentials()).known()
    assert known is not None
    assert (known.version, known.dialect) == ("1.18.33", LINE_1_18)
