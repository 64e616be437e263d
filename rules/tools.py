"""Cheap checks on raw messages, so that only candidates are validated and given to the rules
(the built-in triggers, `rules.triggers`, ask these).

They run on every message of long histories: exact type checks on parsed JSON, no models.
`tool_status` and `is_open_tool` read one tool item the same way, for the proxy's events.
What each runtime keeps where is in :mod:`rules.runtimes`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rules.models import Api
from rules.runtimes import RUNTIMES

OPEN_STATUSES: Mapping[Api, frozenset[str]] = {
    api: runtime.open_statuses for api, runtime in RUNTIMES.items()
}


def has_open_tool(raw_message: Any, api: Api) -> bool:
    """Cheap check on the raw JSON, so only candidate messages are validated into models.

    Parsed JSON only ever holds plain dicts and lists, so exact type checks suffice, and on a
    history of thousands of messages they cost a fraction of `isinstance` against an ABC.
    """
    if type(raw_message) is not dict:
        return False
    runtime = RUNTIMES[api]
    items = raw_message.get(runtime.item_key)
    if type(items) is not list:
        return False
    open_statuses = runtime.open_statuses
    for item in items:
        state = item.get("state") if type(item) is dict else None
        if type(state) is dict and state.get("status") in open_statuses:
            return True
    return False


def tool_status(item: Any) -> str | None:
    """The status of a tool (a v1 part, a v2 content item) as the server shows it; None for any
    other item, or a tool without one."""
    if not isinstance(item, dict) or item.get("type") != "tool":
        return None
    state = item.get("state")
    status = state.get("status") if isinstance(state, dict) else None
    return status if isinstance(status, str) else None


def is_open_tool(item: Any, api: Api) -> bool:
    """Whether `item` is a tool in one of `api`'s open statuses: its call may still run. Anything
    else (another status, another item) is not open."""
    return tool_status(item) in RUNTIMES[api].open_statuses


def is_unfinished_assistant(raw_message: Any, api: Api) -> bool:
    """Cheap check on the raw JSON: an assistant message the server never recorded as finished."""
    if type(raw_message) is not dict:
        return False
    runtime = RUNTIMES[api]
    header = runtime.header(raw_message)
    if type(header) is not dict or header.get(runtime.role_key) != "assistant":
        return False
    time = header.get("time")
    return type(time) is dict and time.get("completed") is None


__all__ = [
    "OPEN_STATUSES",
    "has_open_tool",
    "is_open_tool",
    "is_unfinished_assistant",
    "tool_status",
]
