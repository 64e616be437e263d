"""How the demo speaks to each opencode release line: its project config, health, warm-up, turn,
message view and event stream, and how a tool call reads in a view and in an event.

Both lines were measured (1.18.33 and 2.1.2, `tests/integration/opencode_server.py` and
`tests/opencode2/servers.py` start them the same way); the line is told by `opencode --version`.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import quote

from proxy.demo.model import Plan
from proxy.opencode.events_2x import api_call_id
from proxy.opencode.vocabulary import API_CALL_STARTED, API_TOOL_FAILED, PART_UPDATED, TOOL_RUNNING

COMMAND = "echo settle-proxy demo && sleep 600"
"""What the call runs: long enough to outlive the demo, which ends it."""
PROMPT = "run the demo command"
_VERSION = re.compile(r"(?:opencode )?v?((\d+)\.\d+\.\d+\S*)")


@dataclass(frozen=True, slots=True)
class Call:
    """A tool call as one client is shown it: its id, status and, once failed, the error's text."""

    id: str
    status: str
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Request:
    """One HTTP request of the demo's, relative to a server's origin."""

    method: str
    path: str
    body: dict[str, Any] | None = None
    params: dict[str, str] | None = None
    headers: dict[str, str] | None = None


class Line(ABC):
    """One release line, as the demo drives it."""

    name: ClassVar[str]
    tool: ClassVar[str]
    health: ClassVar[str]
    events: ClassVar[str]
    told_by: ClassVar[str]
    """The event that tells a client a call failed."""
    stays: ClassVar[str]
    """How long a call a crash cut off stays `running` in the server's own view."""
    first_start: ClassVar[str] = ""
    """What its first start does that takes a while, said while it starts."""

    @abstractmethod
    def config(self, model_base_url: str) -> dict[str, Any]:
        """The project's `opencode.json`: the mock model its only one, every tool allowed."""

    @abstractmethod
    def warm_up(self, project: Path) -> list[Request]:
        """What must answer 200 before a first prompt runs (else the model is "unavailable")."""

    @abstractmethod
    def new_session(self, project: Path) -> Request:
        """The request that creates a session in `project`."""

    @abstractmethod
    def session_id(self, created: Any) -> str:
        """The id in `new_session`'s answer."""

    @abstractmethod
    def prompt(self, session: str, project: Path) -> Request:
        """The request that starts the turn that runs the call."""

    @abstractmethod
    def messages(self, session: str, project: Path) -> Request:
        """The session's message view."""

    @abstractmethod
    def call_in(self, view: Any) -> Call | None:
        """The demo's call in a message view, if it is there yet."""

    @abstractmethod
    def call_event(self, frame: Any, call_id: str) -> Call | None:
        """What one event of the stream says of the call `call_id`, if anything."""

    def plan(self) -> Plan:
        """How the model answers the prompt: one call of `COMMAND`."""
        return Plan(command=COMMAND, tool=self.tool)


class Line1x(Line):
    """1.x: v1 sessions (`/session`), `/global/event`, a password in `OPENCODE_SERVER_PASSWORD`."""

    name, tool, health, events = "1.x", "bash", "/global/health", "/global/event"
    told_by, stays = PART_UPDATED, "for good"
    first_start = " (first start installs its plugin)"

    def config(self, model_base_url: str) -> dict[str, Any]:
        provider = {
            "npm": "@ai-sdk/openai-compatible",
            "name": "Mock",
            "options": {"baseURL": model_base_url, "apiKey": "x"},
            "models": {"m": {"name": "Mock", "tool_call": True}},
        }
        return {"provider": {"mock": provider}, "model": "mock/m", "permission": "allow"}

    def warm_up(self, project: Path) -> list[Request]:
        inside = _directory(project)
        return [
            Request("GET", "/config"),
            Request("GET", "/api/location"),
            Request("GET", "/api/location", headers=inside),
            Request("GET", "/api/provider/mock", headers=inside),
        ]

    def new_session(self, project: Path) -> Request:
        return Request("POST", "/session", {}, headers=_directory(project))

    def session_id(self, created: Any) -> str:
        return str(created["id"])

    def prompt(self, session: str, project: Path) -> Request:
        body = {"parts": [{"type": "text", "text": PROMPT}]}
        return Request("POST", f"/session/{session}/prompt_async", body, headers=_directory(project))

    def messages(self, session: str, project: Path) -> Request:
        return Request("GET", f"/session/{session}/message", headers=_directory(project))

    def call_in(self, view: Any) -> Call | None:
        for message in view:
            for part in message.get("parts") or []:
                if part.get("type") == "tool" and part.get("tool") == self.tool:
                    return _v1_call(part)
        return None

    def call_event(self, frame: Any, call_id: str) -> Call | None:
        event = frame.get("payload") or {}
        part = (event.get("properties") or {}).get("part") or {}
        if event.get("type") != PART_UPDATED or part.get("id") != call_id:
            return None
        return _v1_call(part)


class Line2x(Line):
    """2.x: `/api/session`, `/api/event`, a password always (`OPENCODE_PASSWORD`)."""

    name, tool, health, events = "2.x", "shell", "/api/info", "/api/event"
    told_by, stays = API_TOOL_FAILED, "until the session's next prompt"

    def config(self, model_base_url: str) -> dict[str, Any]:
        """The project `opencode.json` a 2.x server reads: the `mock` provider, its one model `m`, and
        every permission allowed. Its shape: `Info` (`providers`, `model`, `permissions`) in
        `packages/schema/src/config.ts`, a provider's `Info` and `Model` (`package` with the `aisdk:`
        prefix of `packages/core/src/provider.ts` `AISDK_PREFIX`, `settings`, `models`, `capabilities`)
        in `packages/schema/src/config/provider.ts` and `Capabilities` in `packages/schema/src/model.ts`,
        a rule (`action`, `resource`, `effect`) in `packages/schema/src/permission.ts`; the file is
        found from the session's directory upward (`packages/core/src/config.ts` `discover`), all at
        anomalyco/opencode @2092350cf (the `v2` branch). 1.x's `provider`/`options`/`npm` shape is
        migrated too (`packages/core/src/config/normalize.ts`), but this is the line's own."""
        model = {"name": "Mock", "capabilities": {"tools": True, "input": ["text"], "output": ["text"]}}
        provider = {
            "name": "Mock",
            "package": "aisdk:@ai-sdk/openai-compatible",
            "settings": {"baseURL": model_base_url, "apiKey": "x"},
            "models": {"m": model},
        }
        return {
            "providers": {"mock": provider},
            "model": "mock/m",
            "permissions": [{"action": "*", "resource": "*", "effect": "allow"}],
        }

    def warm_up(self, project: Path) -> list[Request]:
        inside = {"location[directory]": str(project)}
        return [
            Request("GET", "/api/location", params=inside),
            Request("GET", "/api/provider/mock", params=inside),
        ]

    def new_session(self, project: Path) -> Request:
        body = {"location": {"directory": str(project)}, "model": {"id": "m", "providerID": "mock"}}
        return Request("POST", "/api/session", body)

    def session_id(self, created: Any) -> str:
        return str(created["data"]["id"])

    def prompt(self, session: str, project: Path) -> Request:
        return Request("POST", f"/api/session/{session}/prompt", {"text": PROMPT})

    def messages(self, session: str, project: Path) -> Request:
        return Request("GET", f"/api/session/{session}/message")

    def call_in(self, view: Any) -> Call | None:
        for message in view.get("data") or []:
            for item in message.get("content") or []:
                if item.get("type") == "tool" and item.get("name") == self.tool:
                    state = item.get("state") or {}
                    return Call(str(item["id"]), str(state.get("status")), _text(state.get("error")))
        return None

    def call_event(self, frame: Any, call_id: str) -> Call | None:
        data = frame.get("data")
        if not isinstance(data, dict) or (found := api_call_id(data)) is None or found[1] != call_id:
            return None
        if frame.get("type") == API_TOOL_FAILED:
            return Call(call_id, "error", _text(data.get("error")))
        return Call(call_id, TOOL_RUNNING) if frame.get("type") == API_CALL_STARTED else None

    def plan(self) -> Plan:
        # `timeout: 0` lifts the tool's 2-minute default, so the call outlives the demo.
        return Plan(tool=self.tool, arguments={"command": COMMAND, "timeout": 0})


def line_of(printed: str) -> tuple[Line, str] | None:
    """The line and version `opencode --version` printed (`1.18.33`, `opencode v2.1.2`); None for
    anything else."""
    found = _VERSION.fullmatch(printed.strip())
    major = int(found.group(2)) if found else None
    line = Line1x() if major == 1 else Line2x() if major == 2 else None
    return None if line is None or found is None else (line, found.group(1))


def _directory(project: Path) -> dict[str, str]:
    """The header 1.x's own clients pick a directory's instance with."""
    return {"x-opencode-directory": quote(str(project), safe="")}


def _v1_call(part: dict[str, Any]) -> Call:
    state = part.get("state") or {}
    return Call(str(part["id"]), str(state.get("status")), _text(state.get("error")))


def _text(error: Any) -> str | None:
    """An error's words: 1.x's is a string, 2.x's `{type, message}`."""
    if isinstance(error, dict):
        return str(error.get("message") or error.get("type"))
    return None if error is None else str(error)
