"""The two runtimes 1.18.33 serves: v1 (`/session/...`) and v2 (`/api/session/...`).

What a runtime is, and what code asks of it, is :mod:`rules.runtime`; opencode 2.x's shape is
:mod:`rules.runtime_2x`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rules.models import Api, JSONObject, Message, V1Message, V2Message
from rules.runtime import BY_MODEL, Runtime, UnexpectedShape, extra, view_messages

__all__ = [
    "RUNTIMES",
    "V1",
    "V1_ABORTED",
    "V1_ERROR",
    "V2",
    "V2_ERROR",
    "Runtime",
    "UnexpectedShape",
    "V2Shapes",
    "runtime_for",
    "runtime_of",
]

V1_ERROR = "Tool execution aborted"
V2_ERROR: JSONObject = {"type": "unknown", "message": "Tool execution interrupted"}
V1_ABORTED: JSONObject = {"name": "MessageAbortedError", "data": {"message": "Aborted"}}


class _V1(Runtime[V1Message]):
    """The classic runtime: `{"info": {...}, "parts": [...]}`, views are bare."""

    api = Api.V1
    name = "1.18 v1"
    model = V1Message
    item_key = "parts"
    role_key = "role"
    tool_key = "tool"
    item_noun = "part"
    header_path = ("info",)
    open_statuses = frozenset({"pending", "running"})

    def header(self, raw_message: Mapping[str, Any]) -> Any:
        return raw_message.get("info")

    def messages_of(self, document: Any, *, single: bool) -> list[Any]:
        return view_messages(document, self.api, single=single)

    def with_messages(self, document: Any, messages: list[Any], *, single: bool) -> Any:
        return messages[0] if single else messages

    def items(self, message: V1Message) -> Sequence[Any]:
        return message.parts

    def created(self, message: V1Message) -> int:
        return message.info.time.created

    def completed(self, message: V1Message) -> bool:
        return message.info.time.completed is not None

    def is_assistant(self, message: V1Message) -> bool:
        return message.info.role == "assistant"

    def message_id_of(self, message: V1Message) -> str:
        return message.info.id

    def call_id(self, item: Any) -> str | None:
        call = extra(item, "callID")
        return call if isinstance(call, str) else None

    def last_alive(self, message: V1Message) -> int:
        times = [message.info.time.created]
        for part in message.parts:
            for span in (part.time, part.state.time if part.state else None):
                if span is not None:
                    times += [t for t in (span.start, span.end) if t is not None]
        return max(times)

    def tool_settled_at(self, message: V1Message, index: int) -> int:
        start = _v1_start(message, index)
        return start if start is not None else message.info.time.created

    def settled_tool(self, message: V1Message, index: int) -> JSONObject:
        ended = self.tool_settled_at(message, index)
        time = {"end": ended} if _v1_start(message, index) is not None else {"start": ended, "end": ended}
        # `metadata.interrupted` is how opencode itself marks an orphaned, interrupted call.
        return {
            "state": {"status": "error", "error": V1_ERROR, "metadata": {"interrupted": True}, "time": time}
        }

    def chosen_model(self, header: Mapping[str, Any]) -> dict[str, str] | None:
        return _model(header.get("providerID"), header.get("modelID"))

    def settled_as_interrupted(self, state: Mapping[str, Any]) -> bool:
        metadata = state.get("metadata")
        interrupted = isinstance(metadata, dict) and metadata.get("interrupted") is True
        return state.get("error") == V1_ERROR and interrupted

    def finished(self, message: V1Message, last_alive: int) -> JSONObject | None:
        patch: JSONObject = {"time": {"completed": last_alive}}
        if message.info.error is None:
            patch["error"] = V1_ABORTED
        return patch


class V2Shapes(Runtime[V2Message]):
    """The v2 runtime: messages with `content`, views wrapped in `{"data": ...}` (1.18's v2 API;
    opencode 2.x keeps the layout and settles otherwise: `rules.runtime_2x`)."""

    api = Api.V2
    name = "1.18 v2"
    model = V2Message
    item_key = "content"
    role_key = "type"
    tool_key = "name"
    item_noun = "call"
    header_path = ()
    open_statuses = frozenset({"streaming", "running"})

    def header(self, raw_message: Mapping[str, Any]) -> Any:
        return raw_message

    def messages_of(self, document: Any, *, single: bool) -> list[Any]:
        container = document.get("data") if isinstance(document, dict) else None
        return view_messages(container, self.api, single=single)

    def with_messages(self, document: Any, messages: list[Any], *, single: bool) -> Any:
        return {**document, "data": messages[0] if single else messages}

    def items(self, message: V2Message) -> Sequence[Any]:
        return message.content

    def created(self, message: V2Message) -> int:
        return message.time.created

    def completed(self, message: V2Message) -> bool:
        return message.time.completed is not None

    def is_assistant(self, message: V2Message) -> bool:
        return message.type == "assistant"

    def message_id_of(self, message: V2Message) -> str:
        return message.id

    def call_id(self, item: Any) -> str | None:
        return item.id if isinstance(item.id, str) else None

    def last_alive(self, message: V2Message) -> int:
        times = [message.time.created]
        for item in message.content:
            if item.time is not None:
                times += [t for t in (item.time.created, item.time.ran, item.time.completed) if t is not None]
        return max(times)

    def tool_settled_at(self, message: V2Message, index: int) -> int:
        time = message.content[index].time
        known = [] if time is None else [t for t in (time.ran, time.created) if t is not None]
        return max(known, default=message.time.created)

    def settled_tool(self, message: V2Message, index: int) -> JSONObject:
        ended = self.tool_settled_at(message, index)
        return {"state": {"status": "error", "error": V2_ERROR}, "time": {"completed": ended}}

    def chosen_model(self, header: Mapping[str, Any]) -> dict[str, str] | None:
        chosen = header.get("model")
        return _model(chosen.get("providerID"), chosen.get("id")) if isinstance(chosen, dict) else None

    def settled_as_interrupted(self, state: Mapping[str, Any]) -> bool:
        error = state.get("error")
        return isinstance(error, dict) and error.get("message") == V2_ERROR["message"]

    def finished(self, message: V2Message, last_alive: int) -> JSONObject | None:
        return {"time": {"completed": last_alive}}


def _model(provider: Any, model: Any) -> dict[str, str] | None:
    if isinstance(provider, str) and isinstance(model, str):
        return {"providerID": provider, "modelID": model}
    return None


def _v1_start(message: V1Message, index: int) -> int | None:
    state = message.parts[index].state
    return state.time.start if state is not None and state.time is not None else None


V1: Runtime[V1Message] = _V1()
V2: Runtime[V2Message] = V2Shapes()
RUNTIMES: Mapping[Api, Runtime[Any]] = {Api.V1: V1, Api.V2: V2}
"""The runtime of each route family as 1.18.33 serves it (the shape a caller that names no
runtime gets)."""


def runtime_of(api: Api) -> Runtime[Any]:
    """The runtime 1.18.33 serves `api` in."""
    return RUNTIMES[api]


def runtime_for(message: Message) -> Runtime[Any]:
    """The runtime a validated message belongs to: the one whose model validated it."""
    return BY_MODEL[type(message)]
