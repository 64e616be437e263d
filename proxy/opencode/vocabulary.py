"""opencode's vocabulary, said once: the event types the proxy reads and sends, the statuses and
what they mean for liveness, and the events that announce a settlement.

Every other module asks this one instead of spelling an event type or a status (a test reads
the proxy's source to keep it so). A new opencode event goes here, with what it means.

The settled *shapes* (what a tool interrupted by a crash looks like in v1 and v2, and which
tool statuses are open) belong to the rules, which may not import the proxy: they are
:mod:`rules.runtimes`, and the names here refer to them. Measured on opencode 1.18.33
(`tests/fixtures/opencode-1.18.33/`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from proxy.opencode.ids import ascending_id
from rules import OPEN_STATUSES, V1_ERROR, V2_ERROR, Api, is_open_tool, tool_status

__all__ = [
    "ANSWERED",
    "API_CALL_ENDED",
    "API_CALL_OPENING",
    "API_EXECUTION_ENDED",
    "API_EXECUTION_STARTED",
    "API_INTERRUPTED",
    "API_SESSION_PREFIX",
    "API_SHUTDOWN",
    "API_TOOL_FAILED",
    "CALL_ENDED",
    "CALL_OPENING",
    "CALL_STARTED",
    "EVENT_PREFIXES",
    "EVENT_TYPES",
    "MESSAGE_UPDATED",
    "OPEN_STATUSES",
    "PART_REMOVED",
    "PART_UPDATED",
    "PERSON_PREFIXES",
    "PROMPT_ADMITTED",
    "SERVER_CONNECTED",
    "SESSION_ERROR",
    "SESSION_IDLE",
    "SESSION_STATUS",
    "STATUS_SUBJECT",
    "STEP_CALLS_TOOLS",
    "STEP_ENDED",
    "TOOL_FAILED",
    "TOOL_RUNNING",
    "V1_ERROR",
    "V1_STATUS_ACTIVE",
    "V2_ERROR",
    "V2_PREFIX",
    "durable_type",
    "ends_turn",
    "event_name",
    "for_replay",
    "idle_status",
    "is_open_tool",
    "mentioned_message",
    "message_subject",
    "message_updated",
    "news_subjects",
    "notice_part",
    "notice_removed",
    "opencode_event",
    "part_settled",
    "part_subject",
    "session_idle",
    "settled_part_id",
    "stated_liveness",
    "tool_failed",
    "tool_failed_data",
    "tool_status",
    "v1_status_active",
]

# v1: the bus events of `/global/event` and `/event`, `{"type", "properties"}`.
SESSION_STATUS = "session.status"
"""`{"sessionID", "status": {"type": …}}`: a session's v1 status (`V1_STATUS_ACTIVE`)."""
SESSION_IDLE = "session.idle"
"""A v1 turn ended; the server sends it after `session.status` idle."""
SESSION_ERROR = "session.error"
"""A v1 turn failed; `session.status` idle and `session.idle` follow."""
SERVER_CONNECTED = "server.connected"
"""The first event of every stream (2.x's too), made as the server takes it: no session's."""
MESSAGE_UPDATED = "message.updated"
"""`{"sessionID", "info"}`: a message's header as it is now."""
PART_UPDATED = "message.part.updated"
PART_REMOVED = "message.part.removed"
"""`{"sessionID", "messageID", "partID"}`: both 1.18.33 clients drop that part from their transcript."""
"""`{"sessionID", "part", "time"}`: a part as it is now (a tool's state among them)."""
PERSON_PREFIXES = ("permission.", "question.")
"""Events of a request a person must answer: `permission.asked`, `question.replied`, …"""
ANSWERED = ("replied", "rejected")
"""The verbs (after the prefix) that say a person's request was answered."""

# v2: the session's durable log, `{"id", "type", "data"}` (in storage `type` ends `.1`, `.2`…).
V2_PREFIX = "session.next."
"""Every v2 session event starts so; any of them says the session did something."""
PROMPT_ADMITTED = "session.next.prompt.admitted"
"""A prompt entered the turn: the server fails every call still open right after it."""
STEP_ENDED = "session.next.step.ended"
"""A step ended; its `finish` other than `STEP_CALLS_TOOLS` ends the turn."""
STEP_CALLS_TOOLS = "tool-calls"
"""The `finish` of a step that called tools: the turn goes on with the next step."""
CALL_STARTED = "session.next.tool.called"
TOOL_FAILED = "session.next.tool.failed"
"""How the server ends a call that failed, and how the proxy announces one it settled."""
CALL_OPENING = ("session.next.tool.input.started", "session.next.tool.input.ended", CALL_STARTED)
"""The events after which a call is open."""
CALL_ENDED = frozenset({"session.next.tool.success", TOOL_FAILED, "session.next.tool.error"})
"""How a v2 call ends; `session.next.tool.progress` and the rest come while it still runs."""

# 2.x: `/api/event`, `{"id", "type", "data", "location"?, "metadata"?, "created", "durable"?}`
# (`packages/schema/src/event.ts` @162a75f99cc1, `session-event.ts` @03130971e20a; the projection
# `message-updater.ts`, /work/notes/opencode2x-facts.md). A call is keyed `id` (newer) or `callID`.
API_SESSION_PREFIX = "session."
"""Every 2.x session event starts so; any of them says the session did something."""
API_EXECUTION, API_TOOL = "session.execution.", "session.tool."
API_EXECUTION_STARTED = "session.execution.started"
API_INTERRUPTED = "session.execution.interrupted"
API_EXECUTION_ENDED = ("session.execution.succeeded", "session.execution.failed", API_INTERRUPTED)
"""How 2.x ends a whole execution (every step and queued input): the session's turn is over."""
API_SHUTDOWN = "shutdown"
"""A server going away: the projection appends no `idle` message ("the drain continues")."""
API_TOOL_FAILED = "session.tool.failed"
API_CALL_OPENING = ("session.tool.input.started", "session.tool.called")  # `streaming`, `running`
API_CALL_ENDED = ("session.tool.success", API_TOOL_FAILED)
"""How a 2.x call ends; `session.tool.progress` and `session.step.*` come while it still runs."""

EVENT_TYPES = frozenset(
    {SESSION_STATUS, SESSION_IDLE, SESSION_ERROR, MESSAGE_UPDATED, PART_UPDATED, PART_REMOVED}
    | {PROMPT_ADMITTED, STEP_ENDED}
    | set(CALL_OPENING)
    | CALL_ENDED
    | {SERVER_CONNECTED, API_EXECUTION_STARTED, *API_EXECUTION_ENDED, *API_CALL_OPENING, *API_CALL_ENDED}
)
"""Every event type named here."""
EVENT_PREFIXES = frozenset({V2_PREFIX, *PERSON_PREFIXES})

_VERSION = re.compile(r"\.\d+$")


def event_name(kind: str) -> str:
    """`session.next.tool.called.1` (storage) and `session.next.tool.called` (history) alike."""
    return _VERSION.sub("", kind)


_DURABLE_VERSIONS = {PART_UPDATED: 1, MESSAGE_UPDATED: 1, TOOL_FAILED: 1}
"""The version of each event the proxy writes, as 1.18.33 stores it (`step.ended` is at 2)."""


def durable_type(kind: str) -> str:
    """The type an event the proxy writes has in the server's storage and in `/sync/replay`."""
    return f"{kind}.{_DURABLE_VERSIONS[kind]}"


# Statuses, and what they mean for liveness.

V1_STATUS_ACTIVE: dict[str, bool] = {"busy": True, "retry": True, "idle": False}
"""The v1 status types of 1.18.33 (`SessionStatus`), and whether each means a turn runs."""
TOOL_RUNNING = "running"
"""The tool status, in both runtimes, whose process runs (an open status before it may still
carry a half-streamed input). Which statuses are open is the rules' `OPEN_STATUSES`, `is_open_tool`."""


def v1_status_active(status: Any) -> bool | None:
    """Whether a v1 status (`{"type": …}`) says the session runs a turn; None for a status
    the proxy does not know, which vouches for nothing either way: no reading is kept from
    it, and a fresh one must be asked (and a listed session in it is not inactive)."""
    kind = status.get("type") if isinstance(status, dict) else None
    return V1_STATUS_ACTIVE.get(kind) if isinstance(kind, str) else None


def settled_part_id(kind: str, properties: Mapping[str, Any]) -> str | None:
    """The id of the v1 tool part a `message.part.updated` shows in a settled (not open) status, else None."""
    part: Any = properties.get("part")
    settled = kind == PART_UPDATED and tool_status(part) is not None and not is_open_tool(part, Api.V1)
    return part["id"] if settled and isinstance(part.get("id"), str) else None


STATUS_SUBJECT = "status"


def mentioned_message(kind: str, properties: Mapping[str, Any]) -> str | None:
    """The message an event speaks of: v1's `info.id` or part, v2's and 2.x's `assistantMessageID`."""
    info, part = properties.get("info"), properties.get("part")
    if kind == MESSAGE_UPDATED and isinstance(info, dict):
        found = info.get("id")
    elif isinstance(part, dict):
        found = part.get("messageID")
    else:
        found = properties.get("assistantMessageID") or properties.get("messageID")
    return found if isinstance(found, str) and found else None


def news_subjects(kind: str, properties: Mapping[str, Any]) -> tuple[str, ...]:
    """What a v1 (or 2.x) event is news of, of what a client can hold: a part (`part:<id>`), a message
    (`message:<id>`: a part is news of its message too), the session's status (`status`); nothing
    for news of the session as a whole (its title, its diff) or of nothing a client holds."""
    if kind in (SESSION_STATUS, SESSION_IDLE, SESSION_ERROR) or kind.startswith(API_EXECUTION):
        return (STATUS_SUBJECT,)
    if kind.startswith(API_TOOL):  # 2.x: a call is news of itself only
        call = properties.get("id") or properties.get("callID")
        return (part_subject(call),) if isinstance(call, str) else ()
    part = properties.get("part")
    info = properties.get("info")
    part_id = part.get("id") if isinstance(part, dict) else properties.get("partID")
    message_id = part.get("messageID") if isinstance(part, dict) else properties.get("messageID")
    if kind == MESSAGE_UPDATED and isinstance(info, dict):
        message_id = info.get("id")
    subjects = [part_subject(part_id)] if isinstance(part_id, str) else []
    return (*subjects, message_subject(message_id)) if isinstance(message_id, str) else tuple(subjects)


def part_subject(part_id: object) -> str:
    return f"part:{part_id}"


def message_subject(message_id: object) -> str:
    return f"message:{message_id}"


def stated_liveness(kind: str, properties: Mapping[str, Any]) -> tuple[Api, bool | None] | None:
    """What an event says of its session's liveness: its runtime, and whether a turn runs
    (None when it only says "something happened"); None for an event that says nothing."""
    if kind == SESSION_STATUS:
        return Api.V1, v1_status_active(properties.get("status"))
    if kind == SESSION_IDLE:
        return Api.V1, False
    if kind.startswith(V2_PREFIX):
        return Api.V2, None
    return None


def ends_turn(kind: str, properties: Mapping[str, Any]) -> bool:
    """Whether an event says its session's turn is over (a status unknown here does not)."""
    if kind == SESSION_STATUS:
        return v1_status_active(properties.get("status")) is False
    return kind in (SESSION_IDLE, SESSION_ERROR, *API_EXECUTION_ENDED)


# The events that announce a settlement, as the server would have sent them.


def opencode_event(kind: str, properties: Mapping[str, object]) -> dict[str, object]:
    """A v1 event in opencode's own shape, with an id of its own ascending kind."""
    return {"id": ascending_id("evt"), "type": kind, "properties": dict(properties)}


def message_updated(session_id: str, info: Mapping[str, Any]) -> dict[str, object]:
    return opencode_event(MESSAGE_UPDATED, {"sessionID": session_id, "info": info})


def idle_status(session_id: str) -> dict[str, object]:
    return opencode_event(SESSION_STATUS, {"sessionID": session_id, "status": {"type": "idle"}})


def session_idle(session_id: str) -> dict[str, object]:
    return opencode_event(SESSION_IDLE, {"sessionID": session_id})


def part_settled(
    session_id: str, part: Mapping[str, Any], info: Mapping[str, Any]
) -> list[dict[str, object]]:
    """v1: a settled tool part, its message, and its session idle (`session_idle` follows)."""
    ended = (part["state"].get("time") or {}).get("end")
    return [
        opencode_event(PART_UPDATED, {"sessionID": session_id, "part": part, "time": ended}),
        message_updated(session_id, info),
        idle_status(session_id),
    ]


def tool_failed_data(session_id: str, message_id: str, item: Mapping[str, Any]) -> dict[str, Any]:
    """The payload of `session.next.tool.failed` for a settled tool item, as the server writes it."""
    return {
        "timestamp": item["time"]["completed"],
        "sessionID": session_id,
        "assistantMessageID": message_id,
        "callID": item["id"],
        "error": V2_ERROR,
        "provider": item.get("provider", {"executed": False}),
    }


def tool_failed(session_id: str, message_id: str, item: Mapping[str, Any]) -> dict[str, Any]:
    """v2: the event a session stream is told for a settled tool item (no `seq`: those are the
    server's to give)."""
    data = tool_failed_data(session_id, message_id, item)
    return {"id": ascending_id("evt"), "type": TOOL_FAILED, "data": data}


def for_replay(event: Mapping[str, Any], session_id: str, seq: int) -> dict[str, Any]:
    """A v2 event as `/sync/replay` appends it: at `seq` of the session's log, its type durable."""
    return {
        "id": event["id"],
        "aggregateID": session_id,
        "seq": seq,
        "type": durable_type(event["type"]),
        "data": event["data"],
    }


# A notice for a person (`addons.live_notices`): what both 1.18.33 clients draw, and take back.


def notice_part(session_id: str, message_id: str, part_id: str, text: str, at_ms: int) -> dict[str, object]:
    """v1: a text part of `message_id` holding `text`, as the server announces a finished one
    (the TUI and the web UI draw it where the transcript ends; the server never holds it)."""
    part = {
        "id": part_id,
        "sessionID": session_id,
        "messageID": message_id,
        "type": "text",
        "text": text,
        "time": {"start": at_ms, "end": at_ms},
    }
    return opencode_event(PART_UPDATED, {"sessionID": session_id, "part": part, "time": at_ms})


def notice_removed(session_id: str, message_id: str, part_id: str) -> dict[str, object]:
    """v1: the notice part taken back from a client that holds it."""
    return opencode_event(PART_REMOVED, {"sessionID": session_id, "messageID": message_id, "partID": part_id})
