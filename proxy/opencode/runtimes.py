"""Each opencode runtime as the proxy meets it over HTTP: the paths of its message views and of
its liveness answer.

What the runtimes' messages look like is in :mod:`rules.runtimes`; this adds only what takes
a request. How liveness is read from these answers is in :mod:`proxy.opencode.liveness`, how
a settlement is written through them in :mod:`proxy.writeback.api_writer`. What a v1 status
means is said in :mod:`proxy.opencode.vocabulary`, for both places that read one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from rules import V1, V2, V2X, Api, Runtime


@dataclass(frozen=True, slots=True)
class HttpRuntime:
    """One runtime's routes."""

    rules: Runtime[Any]
    message_views: re.Pattern[str]
    """The message views the rules check: groups `session`, and `message` for a single one."""
    session_prefix: str
    """Where its session routes start: `/session` (v1), `/api/session` (v2)."""
    liveness_path: str
    """v1 `GET /session/status?directory=…` (kept per directory instance), v2 `GET /api/session/active`."""

    @property
    def api(self) -> Api:
        return self.rules.api

    def messages_path(self, session_id: str, message_id: str | None = None) -> str:
        """The session's message list, or one of its messages."""
        path = f"{self.session_prefix}/{session_id}/message"
        return path if message_id is None else f"{path}/{message_id}"


V1_HTTP = HttpRuntime(
    V1,
    re.compile(r"^/session/(?P<session>[^/]+)/message(?:/(?P<message>[^/]+))?/?$"),
    "/session",
    "/session/status",
)
V2_HTTP = HttpRuntime(
    V2,
    re.compile(r"^/api/session/(?P<session>[^/]+)/(?:context|message(?:/(?P<message>[^/]+))?)/?$"),
    "/api/session",
    "/api/session/active",
)
V2X_HTTP = HttpRuntime(V2X, V2_HTTP.message_views, V2_HTTP.session_prefix, V2_HTTP.liveness_path)
"""opencode 2.x: 1.18's v2 routes, settled in 2.x's shape."""
HTTP_RUNTIMES: dict[Api, HttpRuntime] = {runtime.api: runtime for runtime in (V1_HTTP, V2_HTTP)}
