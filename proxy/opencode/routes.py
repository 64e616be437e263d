"""Which upstream routes are which: message views the rules check (and how their bodies are
shaped), and opencode's event streams."""

from __future__ import annotations

import re
from dataclasses import dataclass

from proxy.opencode.runtimes import V1_HTTP, V2_HTTP
from rules import Api

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


def match_message_route(method: str, path: str) -> MessageRoute | None:
    """Return the message view `path` names, or None for every other route."""
    if method != "GET":
        return None
    for api, pattern in _MESSAGE_ROUTES:
        found = pattern.match(path)
        if found:
            return MessageRoute(api, found["session"], single=found["message"] is not None)
    return None


EVENT_STREAMS = re.compile(r"^/(?:event|global/event|api/event)$")
"""Event streams that open with an event at once (`server.connected`)."""
SESSION_STREAM = re.compile(r"^/api/session/(?P<session>[^/]+)/event$")
"""A v2 session's event stream: its history, then what follows. It sends nothing, not even its
response headers, until it has an event after the `after` a client asked for (1.18.33)."""
