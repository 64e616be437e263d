"""The `routing` addon: which opencode route a request is, matched once per flow.

It runs first, in `request_headers`, and stores the match in the flow (`ROUTE`); the other
addons read it instead of matching the path again in each hook. It also owns the start-timeout
policy of the routes it names, so the relay stays ignorant of opencode's routes, and asks every
event stream uncompressed: events are slipped in between the server's own, which compressed
bytes cannot take (newer 2.x servers compress what a client accepts compressed).
"""

from __future__ import annotations

from typing import ClassVar

from aiohttp import hdrs

from proxy.opencode.routes import Route, match_route
from proxy.relay.bounded import Bounded
from proxy.relay.hooks import Addon, Flow, FlowKey

ROUTE = FlowKey[Route]("route")
_NOWHERE = Route()
REMEMBERED_ROUTES = 1_000
"""How many (method, path) matches are kept: clients poll the same few views and streams."""


class Routing(Addon):
    """Match the route, and set how long the upstream may take to start answering it."""

    name: ClassVar[str] = "routing"

    def __init__(self, prefix: str = "") -> None:
        """`prefix`: where the proxy is mounted, which opencode's paths do not have."""
        self._prefix = prefix
        self._matched: Bounded[tuple[str, str], Route] = Bounded(REMEMBERED_ROUTES)

    async def request_headers(self, flow: Flow) -> None:
        route = flow[ROUTE] = self._route(flow.request.method, flow.request.path.removeprefix(self._prefix))
        flow.start_timeout = route.start_timeout(flow.start_timeout)
        if route.stream is not None:
            flow.upstream_headers[hdrs.ACCEPT_ENCODING] = "identity"

    def _route(self, method: str, path: str) -> Route:
        """`match_route`, remembered: a route depends on nothing else, and a few regular
        expressions and two objects per request are a visible share of a small answer."""
        key = (method, path)
        route = self._matched.get(key)
        if route is None:
            route = self._matched[key] = match_route(method, path)
        return route


def route_of(flow: Flow) -> Route:
    """The flow's route (none, should `routing` have failed: the others then leave the flow alone)."""
    return flow.get(ROUTE) or _NOWHERE


def message_view(flow: Flow) -> bool:
    """The scope of an addon that acts on message views only."""
    return route_of(flow).messages is not None


def event_stream(flow: Flow) -> bool:
    """The scope of an addon that acts on opencode's event streams only."""
    return route_of(flow).stream is not None
