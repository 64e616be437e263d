"""Start turns in either opencode runtime and wait until their bash tool really runs.

The two runtimes of opencode 1.18.33 keep separate stores, so a `Turn` remembers which one it
belongs to and knows its own message routes; the same test can then read the view directly from
opencode or through the proxy by changing only the base URL.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal, TypeVar

from proxy.addons.settle import SETTLED_HEADER

from .http_client import Reply, request
from .opencode_server import directory_header
from .polling import poll

Runtime = Literal["v1", "v2"]
RUNTIMES: tuple[Runtime, ...] = ("v1", "v2")

_TOOL_START_TIMEOUT_S = 60.0

K = TypeVar("K")


@dataclass(frozen=True)
class Turn:
    """One prompt sent to one session; `directory` is the project it runs in."""

    runtime: Runtime
    session_id: str
    directory: Path
    prompt: str

    @property
    def messages_path(self) -> str:
        """The list route of this runtime's message view."""
        prefix = "/session" if self.runtime == "v1" else "/api/session"
        return f"{prefix}/{self.session_id}/message"

    def message_path(self, message_id: str) -> str:
        """The single-message route of this runtime."""
        return f"{self.messages_path}/{message_id}"


@dataclass(frozen=True)
class RunningTool:
    """Where the running bash call sits: the assistant message that holds it, and the tool itself."""

    message_id: str
    tool: dict[str, Any]


@dataclass(frozen=True)
class Observed:
    """A turn and its bash call as seen while it really ran (before a crash, say)."""

    turn: Turn
    running: RunningTool

    @property
    def session_id(self) -> str:
        return self.turn.session_id

    @property
    def runtime(self) -> Runtime:
        return self.turn.runtime

    @property
    def message_id(self) -> str:
        return self.running.message_id

    @property
    def tool_id(self) -> str:
        """The v1 part id, or the v2 call id."""
        return str(self.running.tool["id"])

    def paths(self) -> tuple[str, str]:
        """The list route and the single-message route that hold the tool."""
        return self.turn.messages_path, self.turn.message_path(self.running.message_id)


def start_v1_turn(base_url: str, directory: Path, prompt: str) -> Turn:
    """`POST /session` in `directory`, then `POST /session/{id}/prompt_async` (204, runs in background).

    The v1 API takes the directory from `?directory=` or the `x-opencode-directory` header; the
    header is what opencode's own clients send.
    """
    created = request("POST", f"{base_url}/session", json={}, headers=directory_header(directory))
    _expect(created.status == 200, "POST /session", created.status, created.body)
    session_id = str(created.json()["id"])
    body = {"parts": [{"type": "text", "text": prompt}]}
    prompted = request(
        "POST",
        f"{base_url}/session/{session_id}/prompt_async",
        json=body,
        headers=directory_header(directory),
    )
    _expect(prompted.status == 204, "POST prompt_async", prompted.status, prompted.body)
    return Turn("v1", session_id, directory, prompt)


def start_v2_turn(base_url: str, directory: Path, prompt: str) -> Turn:
    """`POST /api/session` with the directory as its location, then `POST /api/session/{id}/prompt`."""
    session = {"location": {"directory": str(directory)}, "model": {"id": "m", "providerID": "mock"}}
    created = request("POST", f"{base_url}/api/session", json=session)
    _expect(created.status == 200, "POST /api/session", created.status, created.body)
    session_id = str(created.json()["data"]["id"])
    prompted = request(
        "POST", f"{base_url}/api/session/{session_id}/prompt", json={"prompt": {"text": prompt}}
    )
    _expect(prompted.status == 200, "POST /api/session/{id}/prompt", prompted.status, prompted.body)
    return Turn("v2", session_id, directory, prompt)


def start_turn(runtime: Runtime, base_url: str, directory: Path, prompt: str) -> Turn:
    """Start a turn in the given runtime, so tests can be written once for both."""
    starter = start_v1_turn if runtime == "v1" else start_v2_turn
    return starter(base_url, directory, prompt)


def observe_running(
    base_url: str, directory: Path, prompts: Mapping[K, tuple[Runtime, str]]
) -> dict[K, Observed]:
    """Start every turn of `prompts` ((runtime, prompt) by key) first, so that their start-ups
    overlap, then wait for each one's tool to run."""
    turns = {
        key: start_turn(runtime, base_url, directory, prompt) for key, (runtime, prompt) in prompts.items()
    }
    return {key: Observed(turn, wait_tool_running(base_url, turn)) for key, turn in turns.items()}


def send_prompt(base_url: str, turn: Turn, text: str) -> None:
    """A further prompt in the turn's existing session, through the runtime's own prompt route."""
    if turn.runtime == "v1":
        path, body = f"/session/{turn.session_id}/prompt_async", {"parts": [{"type": "text", "text": text}]}
        reply = request("POST", base_url + path, json=body, headers=directory_header(turn.directory))
        _expect(reply.status == 204, f"POST {path}", reply.status, reply.body)
        return
    path = f"/api/session/{turn.session_id}/prompt"
    reply = request("POST", base_url + path, json={"prompt": {"text": text}})
    _expect(reply.status == 200, f"POST {path}", reply.status, reply.body)


def is_active(base_url: str, turn: Turn) -> bool:
    """Whether the server says the session runs a turn (v1 is asked in the session's own directory)."""
    if turn.runtime == "v1":
        reply = request("GET", f"{base_url}/session/status", headers=directory_header(turn.directory))
        _expect(reply.status == 200, "GET /session/status", reply.status, reply.body)
        status = reply.json().get(turn.session_id)
        return status is not None and status.get("type") != "idle"
    reply = request("GET", f"{base_url}/api/session/active")
    _expect(reply.status == 200, "GET /api/session/active", reply.status, reply.body)
    return turn.session_id in reply.json()["data"]


def wait_turn_done(
    base_url: str, turn: Turn, *, timeout: float = _TOOL_START_TIMEOUT_S
) -> list[dict[str, Any]]:
    """Poll until the session is inactive and its newest message is an assistant answer with text
    and `time.completed`; return the messages then."""
    return poll(
        partial(turn_done, base_url, turn),
        what=f"{turn.runtime} turn in {turn.session_id} to finish",
        timeout=timeout,
        interval=0.25,
    )


def turn_done(base_url: str, turn: Turn) -> list[dict[str, Any]] | None:
    """The turn's messages once it is over (`wait_turn_done`), else None."""
    messages = read_messages(base_url, turn)
    if is_active(base_url, turn) or not _answered(messages, turn.runtime):
        return None
    return messages


def _answered(messages: list[dict[str, Any]], runtime: Runtime) -> bool:
    """Whether the newest message is a completed assistant message that holds text."""
    if not messages:
        return False
    if runtime == "v1":
        newest = max(messages, key=lambda m: m["info"]["time"]["created"])
        info, items = newest["info"], newest["parts"]
        is_assistant = info.get("role") == "assistant"
    else:
        newest = max(messages, key=lambda m: m["time"]["created"])
        info, items = newest, newest.get("content", [])
        is_assistant = newest.get("type") == "assistant"
    has_text = any(item.get("type") == "text" for item in items)
    return is_assistant and has_text and "completed" in info["time"]


def wait_tool_running(base_url: str, turn: Turn, *, timeout: float = _TOOL_START_TIMEOUT_S) -> RunningTool:
    """Poll the message view until the bash call is `running` and its view has stopped changing.

    A v1 part is `running` twice: first without output, then again with `metadata.output` once the
    command has printed. Only the second is stable until the tool ends, so for v1 the command must
    print before it blocks (the default `echo hello && sleep 600` does). A v2 item is stable as soon
    as it is `running` with `time.ran`.
    """
    return poll(
        lambda: find_running_tool(read_messages(base_url, turn), turn.runtime),
        what=f"{turn.runtime} bash tool running in {turn.session_id}",
        timeout=timeout,
        interval=0.25,
    )


def read_messages(base_url: str, turn: Turn) -> list[dict[str, Any]]:
    """The turn's messages as a plain list (unwrapping the v2 `{"data": [...]}` envelope)."""
    reply = request("GET", f"{base_url}{turn.messages_path}")
    _expect(reply.status == 200, f"GET {turn.messages_path}", reply.status, reply.body)
    messages: list[dict[str, Any]] = payload(reply.json(), turn.runtime)
    return messages


def payload(body: Any, runtime: Runtime) -> Any:
    """What a message view of `runtime` holds: the v1 body itself, the v2 envelope's `data`."""
    return body if runtime == "v1" else body["data"]


def find_running_tool(messages: list[dict[str, Any]], runtime: Runtime) -> RunningTool | None:
    """The first tool that is stably `running` in a message list of `runtime`, if any."""
    for message in messages:
        message_id, tools = tools_of(message, runtime)
        for tool in tools:
            if _stably_running(tool, runtime):
                return RunningTool(message_id, tool)
    return None


def tools_of(message: dict[str, Any], runtime: Runtime) -> tuple[str, list[dict[str, Any]]]:
    """A message's id and its tool items, in either runtime's shape."""
    if runtime == "v1":
        return message["info"]["id"], [p for p in message["parts"] if p.get("type") == "tool"]
    return message["id"], [c for c in message.get("content", []) if c.get("type") == "tool"]


def _stably_running(tool: dict[str, Any], runtime: Runtime) -> bool:
    state = tool["state"]
    if state["status"] != "running":
        return False
    if runtime == "v1":
        return bool(state.get("metadata", {}).get("output"))
    return "ran" in tool["time"]


def _expect(ok: bool, what: str, status: int, body: bytes) -> None:
    if not ok:
        raise AssertionError(f"{what} -> {status}: {body[:500]!r}")


def fetch_settled(url: str, *, timeout: float = 15.0) -> Reply:
    """GET `url`, a stale view through a proxy, until it comes back settled, as a client polls it:
    a fetch within the freshness margin of the crash is left open, and decided afresh on the next."""

    def settled() -> Reply | None:
        reply = request("GET", url)
        assert reply.status == 200, reply.body[:300]
        return reply if reply.headers.get(SETTLED_HEADER) is not None else None

    return poll(settled, what=f"{url} settled", timeout=timeout)
