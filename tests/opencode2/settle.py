"""What opencode 2.x does to calls and compactions a dead process left open, when its next drain starts.

`SessionRunner.drain` runs `settleStaleCompactions`, then `settleStaleToolCalls`, before any model work
(`packages/core/src/session/runner/llm.ts` @008d57153952). Each publishes one durable event per stale
item; the projector (`packages/core/src/session/message-updater.ts`, newest reading idx:70408091340)
turns the stored message into its settled form. This module is both halves, on plain JSON.
"""

from __future__ import annotations

import copy
import enum
from collections.abc import Iterator
from dataclasses import dataclass

from tests.opencode2.shapes import Json

INTERRUPTED = "Tool execution interrupted"
COMPACTION_INTERRUPTED: Json = {"type": "compaction.interrupted", "message": "Compaction was interrupted"}
"""`settleStaleCompactions`'s error (llm.ts @008d57153952)."""


class Settle(enum.Enum):
    """Which `settleStaleToolCalls` the server runs."""

    EARLY = "early"
    """`{type: "aborted", message: "Tool execution interrupted: <name>"}` and `executed`, nothing else
    (llm.ts idx:57428616805 and idx:62605262223)."""
    CHILD = "child"
    """Newer: a `subagent` call naming a child session adds ` (sessionID: <child>)`, a non-empty
    running `metadata` is sent along (llm.ts @008d57153952; 2.0.18 llm.ts:348 per idx:71123457094;
    2.0.24 llm.ts:345 per idx:70823202177)."""


@dataclass(frozen=True)
class Published:
    """One event the settle publishes, before it is framed: its type and its `data`."""

    type: str
    data: Json


def context(messages: list[Json]) -> list[Json]:
    """`store.context(sessionID)`: the messages after the last completed compaction ("the active
    context messages … after the last compaction", `protocol/src/groups/session.ts` `session.context`
    @01fd0c8548b2)."""
    last = max(
        (
            i
            for i, m in enumerate(messages)
            if m.get("type") == "compaction" and m.get("status") == "completed"
        ),
        default=-1,
    )
    return messages[last + 1 :]


def _stale_tools(messages: list[Json]) -> Iterator[tuple[Json, Json]]:
    for message in context(messages):
        if message.get("type") != "assistant":
            continue
        for part in message.get("content", []):
            if part.get("type") == "tool" and part["state"]["status"] in ("streaming", "running"):
                yield message, part


def tool_failures(
    session_id: str, messages: list[Json], settle: Settle, call_key: str = "id"
) -> list[Published]:
    """The `session.tool.failed` events `settleStaleToolCalls` publishes, in stored order. `call_key`
    is `id` (llm.ts @008d57153952, 2.0.18) or `callID` (`schema/src/session-event.ts` @03130971)."""
    found = []
    for message, part in _stale_tools(messages):
        state = part["state"]
        metadata = state.get("metadata") if state["status"] == "running" else None
        reason = f"{INTERRUPTED}: {part['name']}"
        data: Json = {"sessionID": session_id, "assistantMessageID": message["id"], call_key: part["id"]}
        if settle is Settle.CHILD:
            child = (metadata or {}).get("sessionID")
            if part["name"] == "subagent" and isinstance(child, str):
                reason += f" (sessionID: {child})"
        data["error"] = {"type": "aborted", "message": reason}
        if settle is Settle.CHILD and metadata:
            data["metadata"] = metadata
        data["executed"] = part.get("executed") is True
        found.append(Published("session.tool.failed", data))
    return found


def compaction_failures(session_id: str, messages: list[Json]) -> list[Published]:
    """The `session.compaction.failed` events `settleStaleCompactions` publishes: one per compaction
    still `running`, newest first (llm.ts @008d57153952, `orderBy(desc(seq))`)."""
    running = [m for m in messages if m.get("type") == "compaction" and m.get("status") == "running"]
    return [
        Published(
            "session.compaction.failed",
            {
                "sessionID": session_id,
                "reason": message["reason"],
                "inputID": message["id"],
                "error": dict(COMPACTION_INTERRUPTED),
            },
        )
        for message in reversed(running)
    ]


def project_tool_failed(messages: list[Json], data: Json, created: int) -> None:
    """`session.tool.failed` into the stored message (message-updater idx:70408091340): the part
    becomes `error` with the event's error, a streamed (string) input becomes `{}`, the event's
    `metadata` is kept, `executed` is or-ed, `time.completed` is the event's `created`. The
    assistant's own `time.completed` is not touched."""
    call_id = data.get("id", data.get("callID"))
    for message in messages:
        if message.get("id") != data["assistantMessageID"]:
            continue
        for part in reversed(message["content"]):
            if part.get("type") != "tool" or part.get("id") != call_id:
                continue
            if part["state"]["status"] not in ("streaming", "running"):
                return
            tool_input = part["state"]["input"]
            state: Json = {"status": "error", "input": {} if isinstance(tool_input, str) else tool_input}
            state["error"] = data["error"]
            if "metadata" in data:
                state["metadata"] = copy.deepcopy(data["metadata"])
            executed = data["executed"] or part.get("executed") is True
            _replace(part, executed=executed, state=state)
            part["time"]["completed"] = created
            return


TOOL_FIELDS = ("type", "id", "name", "executed", "native", "providerResultState", "state", "time")
"""`AssistantTool`'s field order, the order 2.x encodes a part in (`session-message.ts` @0ceb3dd56f35)."""


def _replace(part: Json, **fields: object) -> None:
    merged = {**part, **fields}
    part.clear()
    part.update({key: merged[key] for key in TOOL_FIELDS if key in merged})


def project_compaction_failed(messages: list[Json], data: Json) -> None:
    """`session.compaction.failed` into the stored messages (message-updater idx:70408091340): the
    last running compaction becomes `failed`, keeping its id, reason, metadata and time."""
    for index in range(len(messages) - 1, -1, -1):
        current = messages[index]
        if current.get("type") == "compaction" and current.get("status") == "running":
            failed: Json = {"id": current["id"], "type": "compaction", "status": "failed"}
            if "metadata" in current:
                failed["metadata"] = current["metadata"]
            failed.update(reason=data["reason"], error=data["error"], time=current["time"])
            messages[index] = failed
            return
