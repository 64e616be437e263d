"""The route is matched once per flow, by the addon that owns the routes' start-timeout policy."""

from __future__ import annotations

from typing import ClassVar

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict

from proxy import testing
from proxy.addons import routing
from proxy.addons.routing import ROUTE, Routing, route_of
from proxy.opencode.routes import EventStream, MessageRoute, Route, match_route
from proxy.relay.hooks import Addon, Flow
from rules import Api

V1 = "ses_dd6bcdaa7ffenxavFWr4GKPq95"


async def routed(
    path: str, start_timeout: float | None, method: str = "GET", *, routing: Routing | None = None
) -> Flow:
    flow = Flow(make_mocked_request(method, path, app=web.Application()), CIMultiDict(), start_timeout)
    await (routing or Routing()).request_headers(flow)
    return flow


@pytest.mark.parametrize(
    ("path", "proxy_timeout", "expected"),
    [
        ("/global/event", 30.0, 5.0),
        ("/event", None, 5.0),
        ("/api/event", 2.0, 2.0),
        ("/api/session/ses_1/event", 30.0, None),
        (f"/session/{V1}/message", 30.0, 30.0),
        ("/file", None, None),
    ],
)
async def test_the_start_timeout_is_the_routes(
    path: str, proxy_timeout: float | None, expected: float | None
) -> None:
    assert (await routed(path, proxy_timeout)).start_timeout == expected


async def test_a_stream_start_is_timed_by_the_route_tables_constant(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("proxy.opencode.routes.STREAM_START_TIMEOUT_S", 0.5)
    assert (await routed("/global/event", 30.0)).start_timeout == 0.5


async def test_what_a_request_is_to_opencode() -> None:
    assert (await routed("/api/session/ses_1/event", None))[ROUTE] == Route(
        stream=EventStream.SESSION, stream_session="ses_1"
    )
    assert (await routed(f"/session/{V1}/message/msg_1", None))[ROUTE] == Route(
        messages=MessageRoute(Api.V1, V1, single=True)
    )
    assert (await routed("/global/event", 30.0, method="POST"))[ROUTE] == Route()


def test_a_flow_routing_never_saw_goes_nowhere() -> None:
    flow = Flow(make_mocked_request("GET", "/global/event", app=web.Application()), CIMultiDict())
    assert route_of(flow) == Route()


class Reading(Addon):
    """Reads the route in every hook, as the addons that act on it do."""

    name: ClassVar[str] = "reading"

    def __init__(self) -> None:
        self.read: list[Route] = []

    async def request_headers(self, flow: Flow) -> None:
        self.read.append(route_of(flow))

    async def response_headers(self, flow: Flow) -> None:
        self.read.append(route_of(flow))
        flow.read_whole(by=self.name)

    async def response(self, flow: Flow) -> None:
        self.read.append(route_of(flow))

    async def done(self, flow: Flow) -> None:
        self.read.append(route_of(flow))


@pytest.fixture
def matched(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths the routing addon matched against the route table, in order."""
    paths: list[str] = []

    def counting(method: str, path: str) -> Route:
        paths.append(path)
        return match_route(method, path)

    monkeypatch.setattr(routing, "match_route", counting)
    return paths


async def test_the_route_is_matched_once_per_flow(matched: list[str]) -> None:
    readers = [Reading(), Reading()]
    await testing.cycle([Routing(), *readers], testing.flow("GET", f"/session/{V1}/message"))
    route = Route(messages=MessageRoute(Api.V1, V1, single=False))
    assert [reader.read for reader in readers] == [[route] * 4] * 2  # every hook of every reader
    assert matched == [f"/session/{V1}/message"]


async def test_a_path_is_matched_once_while_it_is_remembered(
    monkeypatch: pytest.MonkeyPatch, matched: list[str]
) -> None:
    monkeypatch.setattr(routing, "REMEMBERED_ROUTES", 2)
    addon = Routing()
    view = f"/session/{V1}/message"
    flows = []
    for path in (view, view, "/config", "/file", view):
        flow = Flow(make_mocked_request("GET", path, app=web.Application()), CIMultiDict(), None)
        await addon.request_headers(flow)
        flows.append(flow)
    assert matched == [view, "/config", "/file", view], "forgotten once two others were matched"
    assert route_of(flows[1]) == route_of(flows[4]) == Route(messages=MessageRoute(Api.V1, V1, single=False))
