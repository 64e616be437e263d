"""The upstream's health, read for `/_settle/up` and for the guard of a proxy without a password:
one shared reading at most a second old, askers meanwhile waiting on the one under way, so a
health checker polling hard never multiplies load on the server."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from yarl import URL

from proxy.service.app import ASSEMBLY, create_app
from proxy.service.config import Settings
from proxy.service.settle_routes import Answer, UpstreamHealth
from tests.proxy.conftest import ProxyClient
from tests.proxy.service.test_settle_routes_auth import a_second_later

ROUTES = ("/_settle/up", "/_settle/health", "/_settle/metrics", "/_settle/orphans", "/_settle/resume")


class CountingUpstream:
    """Counts `GET /global/health`; everything else is 404."""

    def __init__(self) -> None:
        self.health_requests = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/global/health", self._health)
        return app

    async def _health(self, _: web.Request) -> web.Response:
        self.health_requests += 1
        return web.json_response({"healthy": True, "version": "1.18.33"})


async def test_rapid_requests_to_every_settle_route_cost_one_upstream_request(
    aiohttp_server: Callable[[web.Application], Awaitable[TestServer]],
    aiohttp_client: Callable[[web.Application], Awaitable[ProxyClient]],
) -> None:
    counting = CountingUpstream()
    upstream = await aiohttp_server(counting.app())
    proxy = await aiohttp_client(create_app(Settings(upstream=URL(str(upstream.make_url("/"))))))
    await proxy.app[ASSEMBLY].started.line.known()  # which server it is is asked once, at start
    counting.health_requests = 0
    answers = await asyncio.gather(*(proxy.get(path) for path in ROUTES * 10))
    assert [answer.status for answer in answers] == [200] * len(answers)
    for _ in range(10):
        assert (await proxy.get("/_settle/up")).status == 200
    assert counting.health_requests == 1
    a_second_later(proxy.app)
    assert (await proxy.get("/_settle/up")).status == 200
    assert counting.health_requests == 2


class GatedAsk:
    def __init__(self) -> None:
        self.asked = 0
        self.called = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self) -> Answer:
        self.asked += 1
        self.called.set()
        await self.release.wait()
        return {"reachable": True, "status": 200, "nth": self.asked}


async def test_askers_while_a_reading_is_taken_share_it() -> None:
    ask = GatedAsk()
    health = UpstreamHealth(ask)
    askers = [asyncio.create_task(health.answer()) for _ in range(20)]
    await ask.called.wait()
    ask.release.set()
    answers = await asyncio.gather(*askers)
    assert ask.asked == 1
    assert all(answer == {"reachable": True, "status": 200, "nth": 1} for answer in answers)


async def test_an_asker_that_goes_away_does_not_cancel_the_others_reading() -> None:
    ask = GatedAsk()
    health = UpstreamHealth(ask)
    first = asyncio.create_task(health.answer())
    second = asyncio.create_task(health.answer())
    await ask.called.wait()
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    ask.release.set()
    assert (await second)["nth"] == 1
    assert ask.asked == 1


async def test_a_reading_is_not_answered_from_once_the_server_it_was_of_is_forgotten() -> None:
    """A server that just died (its stream lost, the line forgot it) or restarted is never answered
    for from a reading of the one before, however young that reading is."""
    asked: list[int] = []

    async def ask() -> Answer:
        asked.append(1)
        return {"reachable": True, "nth": len(asked)}

    known: list[object] = [object()]
    health = UpstreamHealth(ask, server=lambda: known[0])
    health.clock = lambda: 0.0
    assert (await health.answer())["nth"] == 1
    assert (await health.answer())["nth"] == 1
    known[0] = None
    assert (await health.answer())["nth"] == 2
    known[0] = object()
    assert (await health.answer())["nth"] == 3
    assert (await health.answer())["nth"] == 3
