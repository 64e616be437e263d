"""Which upstream routes are which: message views the rules check (and how their bodies are
shaped), and opencode's event streams (and how long one may take to start)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from proxy.opencode.runtimes import V1_HTTP, V2_HTTP
from rules import Api, Runtime, runtime_of

_MESSAGE_ROUTES = tuple((runtime.api, runtime.message_views) for runtime in (V2_HTTP, V1_HTTP))


@dataclass(frozen=True, slots=True)
class MessageRoute:
    """A message view: of which runtime, which session, and one message or a list.

    Body shapes: v1 list `[{info, parts}]`, v1 single `{info, parts}`; v2 list
    `{"data": [message], "cursor": {...}}` (the context view has no cursor), v2 single
    `{"data": message}`.
    """

    api: Api
    session_id: str
    single: bool
    runtime: Runtime[Any] | None = None
    """The shape the server settles in, once the server's line says (`Settle` sets it): the
    route alone cannot tell 1.18's v2 from 2.x."""

    @property
    def shape(self) -> Runtime[Any]:
        """The runtime to settle the view in: the line's, else the one 1.18.33 serves `api` in."""
        return self.runtime or runtime_of(self.api)


def match_message_route(method: str, path: str) -> MessageRoute | None:
    """Return the message view `path` names, or None for every other route."""
    if method != "GET":
        return None
    for api, pattern in _MESSAGE_ROUTES:
        found = pattern.match(path)
        if found:
            return MessageRoute(api, found["session"], single=found["message"] is not None)
    return None


STREAM_START_TIMEOUT_S = 5.0
"""How long an event stream that opens at once may take to start (see `Route.start_timeout`)."""
_EVENT_STREAMS = re.compile(r"^/(?:event|global/event|api/event)$")
_SESSION_STREAM = re.compile(r"^/api/session/(?P<session>[^/]+)/event$")


class EventStream(StrEnum):
    """opencode's event streams, by path."""

    GLOBAL = "/global/event"
    """Every directory instance's events, each wrapped with its directory."""
    INSTANCE = "/event"
    """One directory's events (the directory in the query or the `x-opencode-directory` header)."""
    V2 = "/api/event"
    SESSION = "/api/session/{session}/event"
    """A v2 session's event stream: its history, then what follows. It sends nothing, not even
    its response headers, until it has an event after the `after` a client asked for (1.18.33)."""


@dataclass(frozen=True, slots=True)
class Route:
    """What a request is to opencode: a message view, an event stream, or neither (both None)."""

    messages: MessageRoute | None = None
    stream: EventStream | None = None
    stream_session: str | None = None
    """The session a `SESSION` stream follows."""

    def start_timeout(
        self, timeout: float | None, *, booting: bool = False, idempotent: bool = False
    ) -> float | None:
        """How long the upstream may take to start answering, given the proxy's `timeout`.

        opencode's event streams answer at once when it is healthy, but a subscription sent the
        instant its port opens after a restart can go unanswered for 20 s and more (measured on
        1.18.33), and a client waiting on it misses everything meanwhile. So a stream must start
        within `STREAM_START_TIMEOUT_S`, or the client gets a 504 and reconnects. A session's
        stream starts with its next event, however long that takes, so it is not timed while the
        server is known healthy; while it is `booting` (not known to answer yet) it is timed too,
        as 1.18.33 takes one sent then and never answers it (40 s and more, though the session has
        news). No stream is timed once open. An `idempotent` plain request (a GET) is timed the
        same while the server boots: a from-source 2.x build took connections about 2 s before it
        answered, and never answered what it took then (2.1.2 answers 503 instead, measured); a
        504 lets its client ask again, which a POST's could not safely do.
        """
        if self.stream is EventStream.SESSION and not booting:
            return None
        if self.stream is not None or (booting and idempotent):
            return STREAM_START_TIMEOUT_S if timeout is None else min(timeout, STREAM_START_TIMEOUT_S)
        return timeout


def match_route(method: str, path: str) -> Route:
    """What `path` (decoded, as opencode routes it) names for a `method` request."""
    if method != "GET":
        return Route()
    if _EVENT_STREAMS.match(path):
        return Route(stream=EventStream(path))
    if found := _SESSION_STREAM.match(path):
        return Route(stream=EventStream.SESSION, stream_session=found["session"])
    return Route(messages=match_message_route(method, path))
