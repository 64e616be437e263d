"""The contract of a runtime: everything the rules see differ between opencode's message shapes.

The shapes serve the same facts differently: where a message keeps its tool items and its
header, which statuses mean open, which key names the role or the tool, how a view wraps its
messages, and what a settled tool looks like. Code asks the runtime (`runtime_of(api)`,
`runtime_for(message)`, or the one a server line names) instead of branching on it. The HTTP
side of each runtime (routes, liveness request, write-back) lives with the code that speaks HTTP.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Generic, TypeVar

from rules.changes import Path
from rules.models import Api, JSONObject, Message, V1Message, V2Message
from rules.targets import Target

M = TypeVar("M", V1Message, V2Message)

BY_MODEL: dict[type[Message], Runtime[Any]] = {}
"""Every runtime, by the model that validates its messages."""


class UnexpectedShape(ValueError):
    """The message is not the shape the rules know; it must be passed on unchanged."""


class Runtime(ABC, Generic[M]):
    """What differs between the runtimes, for raw JSON (cheap) and for validated messages.

    A runtime is a shape, not a route family: 1.18's v2 API and opencode 2.x serve the same
    routes (`api`) with messages settled differently, so each has its own runtime, its own
    `model` (which is how `runtime_for` tells their messages apart) and its own `name`.
    """

    api: ClassVar[Api]
    name: ClassVar[str]
    """Who serves this shape, for people: "1.18 v1", "1.18 v2", "2.x"."""
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

    def __init__(self) -> None:
        BY_MODEL[self.model] = self

    def settled_as_interrupted(self, state: Mapping[str, Any]) -> bool:
        """Whether a tool's `state` is the one this runtime's settlement of an interrupted call
        leaves (the server's own, or this proxy's: they are the same)."""
        return False

    @abstractmethod
    def chosen_model(self, header: Mapping[str, Any]) -> dict[str, str] | None:
        """`{"providerID", "modelID"}` a message's header names, if it names both."""

    def failed_compaction(self, message: M) -> JSONObject | None:
        """The merge patch that fails `message`, a compaction a crash left running, as the server
        itself would (2.x's `settleStaleCompactions`); None where the server fails none."""
        return None

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
    def finished(self, message: M, last_alive: int) -> JSONObject | None:
        """The merge patch (on the header) that closes an unfinished message at `last_alive`; None
        where the server's own settle leaves it open."""

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
        tool = extra(item, self.tool_key)
        return Target(message_id, item.id, self.call_id(item), tool if isinstance(tool, str) else None)

    @abstractmethod
    def message_id_of(self, message: M) -> str: ...

    @abstractmethod
    def call_id(self, item: Any) -> str | None: ...


def extra(item: Any, key: str) -> Any:
    """A field the models do not declare, read without the exception `getattr` would cost."""
    fields = item.model_extra
    return None if fields is None else fields.get(key)


def view_messages(container: Any, api: Api, *, single: bool) -> list[Any]:
    if single and isinstance(container, dict):
        return [container]
    if not single and isinstance(container, list):
        return list(container)
    raise UnexpectedShape(f"{api} {'message' if single else 'message list'} has an unexpected shape")
