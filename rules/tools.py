"""Facts about tool parts shared by the rules: which are open, and when to say they ended.

The server died at an unknown moment, so every timestamp a rule writes is derived from the
part itself: the last moment the part is known to have been alive. That keeps rules pure
and makes the value stable: every fetch, every proxy instance and a later write-back agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rules.models import Api, Message, V1Message

OPEN_STATUSES: Mapping[Api, frozenset[str]] = {
    Api.V1: frozenset({"pending", "running"}),
    Api.V2: frozenset({"streaming", "running"}),
}


def has_open_tool(raw_message: Any, api: Api) -> bool:
    """Cheap check on the raw JSON, so only candidate messages are validated into models.

    Parsed JSON only ever holds plain dicts and lists, so exact type checks suffice, and on a
    history of thousands of messages they cost a fraction of `isinstance` against an ABC.
    """
    if type(raw_message) is not dict:
        return False
    items = raw_message.get("parts" if api is Api.V1 else "content")
    if type(items) is not list:
        return False
    open_statuses = OPEN_STATUSES[api]
    for item in items:
        state = item.get("state") if type(item) is dict else None
        if type(state) is dict and state.get("status") in open_statuses:
            return True
    return False


def is_unfinished_assistant(raw_message: Any, api: Api) -> bool:
    """Cheap check on the raw JSON: an assistant message the server never recorded as finished."""
    if type(raw_message) is not dict:
        return False
    header = raw_message.get("info") if api is Api.V1 else raw_message
    if type(header) is not dict or header.get(_ROLE_KEY[api]) != "assistant":
        return False
    time = header.get("time")
    return type(time) is dict and time.get("completed") is None


def needs_settling(raw_message: Any, api: Api) -> bool:
    """Whether any rule could have something to say about `raw_message` (cheap, on raw JSON)."""
    return has_open_tool(raw_message, api) or is_unfinished_assistant(raw_message, api)


_ROLE_KEY: Mapping[Api, str] = {Api.V1: "role", Api.V2: "type"}


def open_tool_indexes(message: Message) -> list[int]:
    """Positions of the tool items of `message` whose status is still open."""
    if isinstance(message, V1Message):
        statuses = [
            part.state.status if part.type == "tool" and part.state else None for part in message.parts
        ]
        open_statuses = OPEN_STATUSES[Api.V1]
    else:
        statuses = [
            item.state.status if item.type == "tool" and item.state else None for item in message.content
        ]
        open_statuses = OPEN_STATUSES[Api.V2]
    return [index for index, status in enumerate(statuses) if status in open_statuses]


def tool_settled_at(message: Message, index: int) -> int:
    """The end time to record for the open tool at `index`: its last known sign of life."""
    if isinstance(message, V1Message):
        state = message.parts[index].state
        start = state.time.start if state is not None and state.time is not None else None
        return start if start is not None else message.info.time.created
    time = message.content[index].time
    known = [] if time is None else [t for t in (time.ran, time.created) if t is not None]
    return max(known, default=message.time.created)


def message_last_alive(message: Message) -> int:
    """The last moment anything in `message` is known to have been alive (epoch ms): its
    creation, and every time its parts record. A message left unfinished is closed at it."""
    if isinstance(message, V1Message):
        times = [message.info.time.created]
        for part in message.parts:
            for span in (part.time, part.state.time if part.state else None):
                if span is not None:
                    times += [t for t in (span.start, span.end) if t is not None]
        return max(times)
    times = [message.time.created]
    for item in message.content:
        if item.time is not None:
            times += [t for t in (item.time.created, item.time.ran, item.time.completed) if t is not None]
    return max(times)


def message_completed(message: Message) -> bool:
    """Whether the server already recorded the message as finished."""
    time = message.info.time if isinstance(message, V1Message) else message.time
    return time.completed is not None


def is_assistant(message: Message) -> bool:
    """Only assistant messages run tools; user messages never carry a completion time."""
    return message.info.role == "assistant" if isinstance(message, V1Message) else message.type == "assistant"


__all__ = [
    "OPEN_STATUSES",
    "has_open_tool",
    "is_assistant",
    "is_unfinished_assistant",
    "message_completed",
    "message_last_alive",
    "needs_settling",
    "open_tool_indexes",
    "tool_settled_at",
]
