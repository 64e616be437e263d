"""The upstream's health, read for `/_settle/up`, `/_settle/health` and the details guard:
one shared reading at most a second old, askers meanwhile waiting on the one under way, so a
health checker polling hard never multiplies load on the server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from yarl import URL

from proxy.service.app import ASSEMBLY, create_app
from proxy.service.config import Settings, basic_authorization
from proxy.service.settle_routes import ANSWER_WITHIN_S, WAIT_S, Answer, UpstreamHealth
from tests.proxy.conftest import ProxyClient
from tests.proxy.service.test_settle_routes_auth import a_second_later

GOOD = basic_authorization("opencode", "s3cret")
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


class BootingUpstream:
    """A stand-in for a server still booting: it takes connections at once and answers each
    request only 8 s later (or when released, at the end of the test), once told to boot."""

    def __init__(self) -> None:
        self.booting = False
        self.released = asyncio.Event()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._answer)
        return app

    async def _answer(self, request: web.Request) -> web.Response:
        if self.booting:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.released.wait(), 8)
        if request.path != "/global/health":
            return web.json_response({}, status=404)
        return web.json_response({"healthy": True, "version": "1.18.33"})


@pytest.mark.parametrize("answered_before", [False, True], ids=["booting-from-start", "restarted-booting"])
@pytest.mark.parametrize("authorization", [None, GOOD], ids=["no-password", "password"])
async def test_health_answers_within_its_promise_while_the_upstream_boots(
    aiohttp_server: Callable[[web.Application], Awaitable[TestServer]],
    aiohttp_client: Callable[[web.Application], Awaitable[ProxyClient]],
    answered_before: bool,
    authorization: str | None,
) -> None:
    """It took 5.0 s: the guard waited on one reading, and the route, finding it too old, on
    another. One request waits on the upstream once, within `WAIT_S`."""
    booting = BootingUpstream()
    booting.booting = not answered_before
    upstream = await aiohttp_server(booting.app())
    settings = Settings(upstream=URL(str(upstream.make_url("/"))), authorization=authorization)
    proxy = await aiohttp_client(create_app(settings))
    headers = {"Authorization": authorization} if authorization else {}
    try:
        if answered_before:
            assert (await proxy.get("/_settle/health", headers=headers)).status == 200
            booting.booting = True
            a_second_later(proxy.app)
        for route in ("/_settle/up", "/_settle/health"):
            async with asyncio.timeout(ANSWER_WITHIN_S):
                response = await proxy.get(route, headers=headers)
                said = await response.json()
            assert response.status == 503, said
            a_second_later(proxy.app)
    finally:
        booting.released.set()
    if answered_before or authorization:
        assert (
            said["upstream"]["error"]
            == f"it did not answer within {WAIT_S:g} s (busy, hung, or not an HTTP server)"
        )
    else:  # never answered, so whether it wants a password is unknown
        assert said["message"].startswith(
            "the upstream has not answered yet: whether it requires credentials is unknown; it did not answer within"
        )
