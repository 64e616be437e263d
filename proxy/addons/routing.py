"""The `routing` addon: which opencode route a request is, matched once per flow.

It runs first, in `request_headers`, and stores the match in the flow (`ROUTE`); the other
addons read it instead of matching the path again in each hook. It also owns the start-timeout
policy of the routes it names, so the relay stays ignorant of opencode's routes.
"""

from __future__ import annotations

from typing import ClassVar

from proxy.opencode.routes import Route, match_route
from proxy.relay.hooks import Addon, Flow, FlowKey
from proxy.relay.upstream import opencode_path

ROUTE = FlowKey[Route]("route")
_NOWHERE = Route()


class Routing(Addon):
    """Match the route, and set how long the upstream may take to start answering it."""

    name: ClassVar[str] = "routing"

    async def request_headers(self, flow: Flow) -> None:
        route = flow[ROUTE] = match_route(flow.request.method, opencode_path(flow.request))
        flow.start_timeout = route.start_timeout(flow.start_timeout)


def route_of(flow: Flow) -> Route:
    """The flow's route (none, should `routing` have failed: the others then leave the flow alone)."""
    return flow.get(ROUTE) or _NOWHERE


def message_view(flow: Flow) -> bool:
    """The scope of an addon that acts on message views only."""
    return route_of(flow).messages is not None


def event_stream(flow: Flow) -> bool:
    """The scope of an addon that acts on opencode's event streams only."""
    return route_of(flow).stream is not None
