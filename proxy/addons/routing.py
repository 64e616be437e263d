"""The `routing` addon: which opencode route a request is, matched once per flow.

It runs first, in `request_headers`, and stores the match in the flow (`ROUTE`); the other
addons read it instead of matching the path again in each hook. It also owns the start-timeout
policy of the routes it names, so the relay stays ignorant of opencode's routes: a route's own,
and for a session's stream whether the server is booting (the server line not known: at start,
and from a lost stream or, under `run`, the server's exit until its health answers again), and
so for a plain GET. It asks
every event stream uncompressed: events are slipped in between the server's own, which compressed
bytes cannot take (newer 2.x servers compress what a client accepts compressed).
"""

from __future__ import annotations

from typing import ClassVar

from aiohttp import hdrs

from proxy.opencode.client import Credentials
from proxy.opencode.routes import EventStream, Route, match_route
from proxy.opencode.server_line import ServerLine
from proxy.relay.bounded import Bounded
from proxy.relay.hooks import Addon, Flow, FlowKey

ROUTE = FlowKey[Route]("route")
_NOWHERE = Route()
IDEMPOTENT = frozenset({"GET", "HEAD"})
"""The requests a client may send again after a 504 (RFC 9110 §9.2.2) without doing anything twice."""
REMEMBERED_ROUTES = 1_000
"""How many (method, path) matches are kept: clients poll the same few views and streams."""


class Routing(Addon):
    """Match the route, and set how long the upstream may take to start answering it."""

    name: ClassVar[str] = "routing"

    def __init__(self, prefix: str = "", *, line: ServerLine | None = None) -> None:
        """`prefix`: where the proxy is mounted, which opencode's paths do not have; `line`: which
        server the upstream is, not known while it boots (given none, it never boots)."""
        self._prefix = prefix
        self._line = line
        self._matched: Bounded[tuple[str, str], Route] = Bounded(REMEMBERED_ROUTES)

    async def request_headers(self, flow: Flow) -> None:
        method = flow.request.method
        route = flow[ROUTE] = self._route(method, flow.request.path.removeprefix(self._prefix))
        idempotent = method in IDEMPOTENT
        booting = await self._booting(flow, route)
        flow.start_timeout = route.start_timeout(flow.start_timeout, booting=booting, idempotent=idempotent)
        if route.stream is not None:
            flow.upstream_headers[hdrs.ACCEPT_ENCODING] = "identity"

    async def _booting(self, flow: Flow, route: Route) -> bool:
        """Whether the upstream is not known to answer yet. A session stream waits for its next
        event however long, and only while the server boots is that bounded, so for one a server
        not known yet is asked now (once, however many wait): a healthy server just started is then
        known healthy, not taken for one still booting. A plain GET is not held up for that: a
        healthy server answers it well within the bound anyway."""
        if self._line is None:
            return False
        if route.stream is EventStream.SESSION and self._line.current is None:
            client = Credentials.for_request(flow.request, None)
            await self._line.known(client if client.headers or client.params else None)
        return self._line.current is None

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
