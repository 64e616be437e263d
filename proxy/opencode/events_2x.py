"""opencode 2.x's events of `/api/event`, as the proxy reads them and builds the ones it announces
(their names, and what each means, are :mod:`proxy.opencode.vocabulary`'s)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.opencode.ids import ascending_id
from proxy.opencode.vocabulary import (
    API_EXECUTION_ENDED,
    API_INTERRUPTED,
    API_SESSION_PREFIX,
    API_SHUTDOWN,
    API_TOOL_FAILED,
)
from rules import Api

__all__ = [
    "api_call_id",
    "api_execution_interrupted",
    "api_stated_liveness",
    "api_tool_failed",
    "new_api_frame",
]


def api_stated_liveness(kind: str, data: Mapping[str, Any]) -> tuple[Api, bool | None] | None:
    """`stated_liveness` of a 2.x event (its sessions are the v2 family's)."""
    if kind in API_EXECUTION_ENDED:
        return Api.V2, False
    return (Api.V2, None) if kind.startswith(API_SESSION_PREFIX) else None


def api_call_id(data: Mapping[str, Any]) -> tuple[str, str] | None:
    """The call a 2.x tool event is about, and the key it came under (`id`, else `callID`)."""
    for key in ("id", "callID"):
        if isinstance(value := data.get(key), str):
            return key, value
    return None


def new_api_frame(kind: str, data: Mapping[str, Any], created: Any, directory: str | None) -> dict[str, Any]:
    """A 2.x event as `/api/event` frames one; no `durable`: its `seq` is the server's to give."""
    where = {"location": {"directory": directory}} if directory is not None else {}
    return {"id": ascending_id("evt"), "created": created, "type": kind, "data": dict(data)} | where


def api_tool_failed(
    session_id: str,
    message_id: str,
    item: Mapping[str, Any],
    *,
    key: str = "id",
    directory: str | None = None,
) -> dict[str, Any]:
    """`session.tool.failed` for a call settled in 2.x's shape (`rules.runtime_2x`), as
    `settleStaleToolCalls` publishes it: the error, `executed`, the metadata only when any, and
    the call under the `key` the server used for it. `created` is the settled `time.completed`."""
    state = item["state"]
    data: dict[str, Any] = {"sessionID": session_id, "assistantMessageID": message_id, key: item["id"]}
    data |= {"error": state["error"], "executed": item.get("executed") is True}
    if state.get("metadata"):
        data["metadata"] = state["metadata"]
    return new_api_frame(API_TOOL_FAILED, data, item["time"]["completed"], directory)


def api_execution_interrupted(session_id: str, created: int, directory: str | None = None) -> dict[str, Any]:
    """How 2.x says an execution stopped because the server went away (reason `shutdown`): the
    turn is over for a client, and no `idle` message is projected that the server would not hold."""
    data = {"sessionID": session_id, "reason": API_SHUTDOWN}
    return new_api_frame(API_INTERRUPTED, data, created, directory)
