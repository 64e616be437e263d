"""Each opencode runtime as the proxy meets it over HTTP: the paths of its message views and of
its liveness answer.

What the runtimes' messages look like is in :mod:`rules.runtimes`; this adds only what takes
a request. How liveness is read from these answers is in :mod:`proxy.opencode.liveness`, how
a settlement is written through them in :mod:`proxy.writeback.api_writer`. What a v1 status
means is said in :mod:`proxy.opencode.vocabulary`, for both places that read one.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
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
    prompt_suffix: str
    """Where a turn is started, after the session's path: v1 `prompt_async` (204), v2 `prompt`."""
    prompt_body: Callable[[str, str, str | None, dict[str, str] | None], dict[str, Any]]
    """The body of a prompt (its id, its text, the turn's agent and model, where it takes them)."""
    directed: bool
    """Whether its requests name the session's directory (v1 runs an instance per directory)."""
    wrapped: bool
    """Whether its answers carry what they say in `{"data": …}`."""

    @property
    def api(self) -> Api:
        return self.rules.api

    def session_path(self, session_id: str) -> str:
        return f"{self.session_prefix}/{session_id}"

    def prompt_path(self, session_id: str) -> str:
        return f"{self.session_path(session_id)}/{self.prompt_suffix}"

    def unwrapped(self, answer: Any) -> Any:
        """What an answer carries (v2: inside `data`)."""
        return answer.get("data") if self.wrapped and isinstance(answer, dict) else answer

    def messages_path(self, session_id: str, message_id: str | None = None) -> str:
        """The session's message list, or one of its messages."""
        path = f"{self.session_prefix}/{session_id}/message"
        return path if message_id is None else f"{path}/{message_id}"


def _v1_prompt(prompt_id: str, text: str, agent: str | None, model: dict[str, str] | None) -> dict[str, Any]:
    """v1 takes the turn's agent and model with each prompt (without them: `build`, and the
    session's last-used model, which need not be the turn's)."""
    body: dict[str, Any] = {"messageID": prompt_id, "parts": [{"type": "text", "text": text}]}
    return (
        body
        | ({"agent": agent} if agent is not None else {})
        | ({"model": model} if model is not None else {})
    )


def _v2_prompt(prompt_id: str, text: str, agent: str | None, model: dict[str, str] | None) -> dict[str, Any]:
    """1.18's v2 keeps agent and model on the session."""
    del agent, model
    return {"id": prompt_id, "prompt": {"text": text}}


V1_HTTP = HttpRuntime(
    V1,
    re.compile(r"^/session/(?P<session>[^/]+)/message(?:/(?P<message>[^/]+))?/?$"),
    "/session",
    "/session/status",
    "prompt_async",
    _v1_prompt,
    directed=True,
    wrapped=False,
)
V2_HTTP = HttpRuntime(
    V2,
    re.compile(r"^/api/session/(?P<session>[^/]+)/(?:context|message(?:/(?P<message>[^/]+))?)/?$"),
    "/api/session",
    "/api/session/active",
    "prompt",
    _v2_prompt,
    directed=False,
    wrapped=True,
)
V2X_HTTP = dataclasses.replace(V2_HTTP, rules=V2X)
"""opencode 2.x: 1.18's v2 routes, settled in 2.x's shape."""
