"""One object per opencode runtime (v1, v2) holding everything the rules see differ between them.

The two runtimes serve the same facts in different shapes: where a message keeps its tool items
and its header, which statuses mean open, which key names the role or the tool, how a view wraps
its messages, and what a settled tool looks like. Code asks `runtime_of(api)` (or
`runtime_for(message)`) instead of branching on the runtime. The HTTP side of each runtime
(routes, liveness request, write-back) lives with the code that speaks HTTP.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Generic, TypeVar

from rules.changes import Path
from rules.models import Api, JSONObject, Message, V1Message, V2Message
from rules.targets import Target

M = TypeVar("M", V1Message, V2Message)

V1_ERROR = "Tool execution aborted"
V2_ERROR: JSONObject = {"type": "unknown", "message": "Tool execution interrupted"}
V1_ABORTED: JSONObject = {"name": "MessageAbortedError", "data": {"message": "Aborted"}}


class UnexpectedShape(ValueError):
    """The message is not the shape the rules know; it must be passed on unchanged."""


class Runtime(ABC, Generic[M]):
    """What differs between the runtimes, for raw JSON (cheap) and for validated messages."""

    api: ClassVar[Api]
    model: ClassVar[type[Message]]
    item_key: ClassVar[str]
    """Where a message keeps its items (tools among them)."""
    role_key: ClassVar[str]
    """The header key that says `assistant`."""
    tool_key: ClassVar[str]
    """The item key that names the tool."""
    item_noun: ClassVar[str]
    """What the runtime calls a tool item, for people (logs, reasons)."""
    header_path: ClassVar[Path]
    """Where the message's own fields (id, role, times) sit inside it."""
    open_statuses: ClassVar[frozenset[str]]

    # Raw JSON: parsed dicts, read without validation.

    @abstractmethod
    def header(self, raw_message: Mapping[str, Any]) -> Any:
        """The object holding the message's id, role and times (not checked to be a dict)."""

    def message_id(self, raw_message: Mapping[str, Any]) -> str:
        return str(self.header(raw_message)["id"])

    @abstractmethod
    def messages_of(self, document: Any, *, single: bool) -> list[Any]:
        """The messages of a view, in the view's order; `UnexpectedShape` if it is not a view."""

    @abstractmethod
    def with_messages(self, document: Any, messages: list[Any], *, single: bool) -> Any:
        """`document` with its messages replaced; every other field kept in place."""

    # Validated messages.

    @abstractmethod
    def items(self, message: M) -> Sequence[Any]: ...

    @abstractmethod
    def created(self, message: M) -> int: ...

    @abstractmethod
    def completed(self, message: M) -> bool:
        """Whether the server already recorded the message as finished."""

    @abstractmethod
    def is_assistant(self, message: M) -> bool:
        """Only assistant messages run tools; user messages never carry a completion time."""

    @abstractmethod
    def last_alive(self, message: M) -> int:
        """The last moment anything in `message` is known to have been alive (epoch ms)."""

    @abstractmethod
    def tool_settled_at(self, message: M, index: int) -> int:
        """The end time to record for the open tool at `index`: its last known sign of life."""

    @abstractmethod
    def settled_tool(self, message: M, index: int) -> JSONObject:
        """The merge patch that settles the open tool at `index` as interrupted."""

    @abstractmethod
    def finished(self, message: M, last_alive: int) -> JSONObject:
        """The merge patch (on the header) that closes an unfinished message at `last_alive`."""

    def open_tool_indexes(self, message: M) -> list[int]:
        """Positions of the tool items of `message` whose status is still open."""
        return [
            index
            for index, item in enumerate(self.items(message))
            if item.type == "tool" and item.state is not None and item.state.status in self.open_statuses
        ]

    def target(self, message: M, index: int | None = None) -> Target:
        """The message, or its item at `index`, as a change names it."""
        message_id = self.message_id_of(message)
        if index is None:
            return Target(message_id)
        item = self.items(message)[index]
        tool = _extra(item, self.tool_key)
        return Target(message_id, item.id, self.call_id(item), tool if isinstance(tool, str) else None)

    @abstractmethod
    def message_id_of(self, message: M) -> str: ...

    @abstractmethod
    def call_id(self, item: Any) -> str | None: ...


class _V1(Runtime[V1Message]):
    """The classic runtime: `{"info": {...}, "parts": [...]}`, views are bare."""

    api = Api.V1
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
        return _container(document, self.api, single=single)

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
        call = _extra(item, "callID")
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

    def finished(self, message: V1Message, last_alive: int) -> JSONObject:
        patch: JSONObject = {"time": {"completed": last_alive}}
        if message.info.error is None:
            patch["error"] = V1_ABORTED
        return patch


class _V2(Runtime[V2Message]):
    """The v2 runtime: messages with `content`, views wrapped in `{"data": ...}`."""

    api = Api.V2
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
        return _container(container, self.api, single=single)

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

    def finished(self, message: V2Message, last_alive: int) -> JSONObject:
        return {"time": {"completed": last_alive}}


def _extra(item: Any, key: str) -> Any:
    """A field the models do not declare, read without the exception `getattr` would cost."""
    extra = item.model_extra
    return None if extra is None else extra.get(key)


def _v1_start(message: V1Message, index: int) -> int | None:
    state = message.parts[index].state
    return state.time.start if state is not None and state.time is not None else None


def _container(container: Any, api: Api, *, single: bool) -> list[Any]:
    if single and isinstance(container, dict):
        return [container]
    if not single and isinstance(container, list):
        return list(container)
    raise UnexpectedShape(f"{api} {'message' if single else 'message list'} has an unexpected shape")


V1: Runtime[V1Message] = _V1()
V2: Runtime[V2Message] = _V2()
RUNTIMES: Mapping[Api, Runtime[Any]] = {Api.V1: V1, Api.V2: V2}


def runtime_of(api: Api) -> Runtime[Any]:
    """The runtime object of `api`."""
    return RUNTIMES[api]


def runtime_for(message: Message) -> Runtime[Any]:
    """The runtime a validated message belongs to."""
    return V1 if type(message) is V1Message else V2
