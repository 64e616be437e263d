"""The JSON shapes of opencode 2.x, as its schema encodes them, built for the stand-in and its tests.

Read from `anomalyco/opencode` (see /work/notes/opencode2x-facts.md). Times are epoch milliseconds on
the wire (`DateTimeUtcFromMillis`). Commits are abbreviated; `idx:N` is a file the code index returned
by id without its commit.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import orjson

Json = dict[str, Any]

_ascending = itertools.count(1)


def dumps(value: Any) -> str:
    """JSON as the server writes it (`JSON.stringify`: compact, key order kept)."""
    return orjson.dumps(value).decode()


def ascending(prefix: str) -> str:
    """A fresh id in 2.x's form: the prefix (`msg`, `evt`, `ses`, `per`, `que`), `_`, and a tail that
    sorts by creation (`schema/src/identifier.ts` `ascending`; `session-message.ts` `ID.create`
    @0ceb3dd56f35). Time-based, so a restarted stand-in process never reuses a stored id."""
    return f"{prefix}_{time.time_ns():016x}{next(_ascending):010d}"


MODEL: Json = {"id": "model", "providerID": "provider"}
"""A `Model.Ref` (`schema/src/model.ts`)."""


def user(message_id: str, text: str, created: int) -> Json:
    """`Session.Message.User` (`schema/src/session-message.ts` `User` @0ceb3dd56f35)."""
    return {"id": message_id, "type": "user", "text": text, "time": {"created": created}}


def synthetic(message_id: str, text: str, created: int, description: str | None = None) -> Json:
    """`Session.Message.Synthetic`: 2.1.2 (measured: `{"id","time":{"created"},"text","description",
    "type":"synthetic"}`, `description` only when given)."""
    message: Json = {"id": message_id, "time": {"created": created}, "text": text}
    if description is not None:
        message["description"] = description
    message["type"] = "synthetic"
    return message


def assistant(message_id: str, content: list[Json], created: int, completed: int | None = None) -> Json:
    """`Session.Message.Assistant` (`session-message.ts` `Assistant` @0ceb3dd56f35): `time.completed`
    stays absent while the step runs."""
    time: Json = {"created": created}
    if completed is not None:
        time["completed"] = completed
    return {
        "id": message_id,
        "type": "assistant",
        "agent": "build",
        "model": MODEL,
        "content": content,
        "time": time,
    }


def text(value: str) -> Json:
    """`Session.Message.Assistant.Text` (`session-message.ts` `AssistantText` @0ceb3dd56f35)."""
    return {"type": "text", "text": value}


def tool_streaming(call_id: str, name: str, raw_input: str, created: int) -> Json:
    """A call whose input the model is still writing: `ToolState.Streaming {status, input: string}`
    (`session-message.ts` `ToolStateStreaming`, `AssistantTool` @0ceb3dd56f35)."""
    state = {"status": "streaming", "input": raw_input}
    return {"type": "tool", "id": call_id, "name": name, "state": state, "time": {"created": created}}


def tool_running(
    call_id: str,
    name: str,
    tool_input: Json,
    created: int,
    *,
    metadata: Json | None = None,
    executed: bool = False,
) -> Json:
    """A call that runs: `ToolState.Running {status, input, metadata}`, `time.ran` set when called
    (`session-message.ts` `ToolStateRunning` @0ceb3dd56f35; projection of `session.tool.called`
    idx:70408091340 sets `executed`, `time.ran`, `metadata: {}`)."""
    state = {"status": "running", "input": tool_input, "metadata": metadata or {}}
    part: Json = {"type": "tool", "id": call_id, "name": name, "state": state}
    if executed:
        part["executed"] = True
    part["time"] = {"created": created, "ran": created + 1}
    return part


def tool_completed(call_id: str, name: str, tool_input: Json, created: int, output: str) -> Json:
    """A finished call: `ToolState.Completed {status, input, content: [≥1]}` (`session-message.ts`
    `ToolStateCompleted` @0ceb3dd56f35)."""
    state = {"status": "completed", "input": tool_input, "content": [{"type": "text", "text": output}]}
    time = {"created": created, "ran": created + 1, "completed": created + 2}
    return {"type": "tool", "id": call_id, "name": name, "state": state, "time": time}


def compaction_running(message_id: str, created: int, reason: str = "auto") -> Json:
    """`Session.Message.Compaction.Running` (`session-message.ts` `CompactionRunning` @0ceb3dd56f35;
    projection of `session.compaction.started`: `summary: ""`, idx:70408091340)."""
    return {
        "id": message_id,
        "type": "compaction",
        "status": "running",
        "reason": reason,
        "summary": "",
        "recent": "",
        "time": {"created": created},
    }


def idle(message_id: str, outcome: str, created: int) -> Json:
    """`Session.Message.Idle` (`session-message.ts` `Idle` @0ceb3dd56f35): appended on
    `session.execution.succeeded|failed|interrupted` unless the interruption is a shutdown
    (projection idx:70408091340 `idle`)."""
    return {"id": message_id, "type": "idle", "outcome": outcome, "time": {"created": created}}


def envelope(event_type: str, data: Json, created: int, seq: int | None = None) -> Json:
    """One event as `/api/event` frames it: `{id, created, type, durable?, data}`; a durable session
    event carries `durable: {aggregateID, seq, version}` (`schema/src/event.ts` `durable()`
    @162a75f99cc1)."""
    event: Json = {"id": ascending("evt"), "created": created, "type": event_type}
    if seq is not None:
        event["durable"] = {"aggregateID": data["sessionID"], "seq": seq, "version": 1}
    event["data"] = data
    return event


def error_body(tag: str, message: str, **fields: str) -> Json:
    """A `Schema.TaggedError` as the HttpApi encodes it: `{_tag, ...fields}` (`protocol/src/errors.ts`
    @05428957b351)."""
    return {"_tag": tag, **fields, "message": message}


def session_not_found(session_id: str) -> Json:
    """`SessionNotFoundError` as the handlers fill it (`server/src/handlers/message.ts` @0881eb2d3aa7)."""
    return error_body("SessionNotFoundError", f"Session not found: {session_id}", sessionID=session_id)


def message_not_found(session_id: str, message_id: str) -> Json:
    """`MessageNotFoundError` (`server/src/handlers/session.ts` `session.fork` @01f42103c20d)."""
    return error_body(
        "MessageNotFoundError", f"Message not found: {message_id}", sessionID=session_id, messageID=message_id
    )


def conflict(message_id: str, held_as: str = "Prompt message ID") -> Json:
    """An input id another input holds: 2.1.2 (measured: `{"_tag":"ConflictError","message":"Prompt
    message ID conflicts with an existing durable record: <id>","resource":"<id>"}`, and "Synthetic
    input ID conflicts …" for a synthetic input)."""
    return {
        "_tag": "ConflictError",
        "message": f"{held_as} conflicts with an existing durable record: {message_id}",
        "resource": message_id,
    }


def inbox_item(
    kind: str, message_id: str, session_id: str, created: int, payload: Json, *, delivery: str = "steer"
) -> Json:
    """`Session.Inbox.User | Synthetic`: `{id, sessionID, time: {created}, type, payload, delivery}`,
    `steer` by default (2.1.2, measured; `schema/src/session-inbox.ts` @1d23a169e0fb had `timeCreated`)."""
    return {
        "id": message_id,
        "sessionID": session_id,
        "time": {"created": created},
        "type": kind,
        "payload": payload,
        "delivery": delivery,
    }


def earlier(value: Any, ms: int) -> None:
    """Every `time` object in `value` (messages, in place) `ms` milliseconds earlier."""
    if isinstance(value, dict):
        for key, inner in value.items():
            if key == "time" and isinstance(inner, dict):
                value[key] = {name: at - ms for name, at in inner.items()}
            else:
                earlier(inner, ms)
    elif isinstance(value, list):
        for inner in value:
            earlier(inner, ms)
