"""What the write-back tests look for in views, logs and event logs: the observed tool, the
settled shape opencode itself writes for an interrupted call, and a whole event log."""

from __future__ import annotations

from typing import Any

from ..expected import V1_PART_ERROR, V2_TOOL_ERROR
from ..turns import Observed
from .sessions import NEXT_COMMAND, TOOL_FAILED, Events, NextTurn, Replayed


def tools(message: dict[str, Any]) -> list[dict[str, Any]]:
    items = message["parts"] if "parts" in message else message.get("content", [])
    return [item for item in items if item.get("type") == "tool"]


def tool_in(messages: list[dict[str, Any]], observed: Observed) -> dict[str, Any]:
    """The observed tool in a message list of its runtime (v1 parts, v2 content), by id."""
    found = [tool for message in messages for tool in tools(message) if tool["id"] == observed.tool_id]
    assert len(found) == 1, f"{observed.tool_id} appears {len(found)} times in {observed.session_id}"
    return found[0]


def message_in(messages: list[dict[str, Any]], observed: Observed) -> dict[str, Any]:
    """The v1 message (`info`) or v2 message that holds the observed tool."""
    found = [m for m in messages if any(t["id"] == observed.tool_id for t in tools(m))]
    assert len(found) == 1, f"{observed.tool_id}: {len(found)} messages hold it"
    return found[0]


def is_open(tool: dict[str, Any]) -> bool:
    return tool["state"]["status"] in ("pending", "streaming", "running")


def with_ids(stored_part: dict[str, Any], observed: Observed) -> dict[str, Any]:
    """A v1 part row's JSON with the ids the row keeps in columns, as the API shows it."""
    ids = {"id": observed.tool_id, "sessionID": observed.session_id, "messageID": observed.running.message_id}
    return {**ids, **stored_part}


def assert_settled(tool: dict[str, Any], observed: Observed) -> None:
    """The shape opencode itself writes for an interrupted call, everything else as it ran."""
    running = observed.running.tool
    state, before = tool["state"], running["state"]
    assert state["status"] == "error", f"{observed.tool_id} is {state['status']}"
    assert state["input"] == before["input"]
    assert {k: v for k, v in tool.items() if k not in ("state", "time")} == {
        k: v for k, v in running.items() if k not in ("state", "time")
    }
    if observed.turn.runtime == "v1":
        assert state["error"] == V1_PART_ERROR
        assert state["metadata"] == {**before["metadata"], "interrupted": True}
        assert state["time"]["start"] == before["time"]["start"]
        assert state["time"]["end"] >= state["time"]["start"]
    else:
        assert state["error"] == V2_TOOL_ERROR
        assert {k: v for k, v in tool["time"].items() if k != "completed"} == running["time"]
        assert tool["time"]["completed"] >= running["time"]["ran"]


def written_lines(log: str, session_id: str) -> list[str]:
    return [line for line in log.splitlines() if "wrote back" in line and session_id in line]


def failures(events: Events, call_id: str) -> list[int]:
    """Seqs of the `tool.failed` events of one call."""
    return [
        seq for seq, kind, _, data in events if kind.startswith(TOOL_FAILED) and data.get("callID") == call_id
    ]


def assert_contiguous(events: Events, last_seq: int | None = None) -> None:
    seqs = [seq for seq, _, _, _ in events]
    assert seqs == list(range(len(seqs))), f"seqs not contiguous from 0: {seqs}"
    if last_seq is not None:
        assert last_seq == seqs[-1], f"event_sequence says {last_seq}, the log ends at {seqs[-1]}"


def assert_replay_consistent(replay: Replayed, observed: Observed) -> None:
    """One `tool.failed` for the call, a gap-free log in step with `event_sequence`, and the SSE
    replay carrying exactly the stored `session.next.*` events in order (ours parses like the rest)."""
    found = failures(replay.stored, observed.tool_id)
    assert len(found) == 1, f"tool.failed stored {len(found)} times for the call"
    assert_contiguous(replay.stored, replay.last_seq)
    public = [(seq, kind.rsplit(".", 1)[0], event_id) for seq, kind, event_id, _ in replay.stored]
    public = [entry for entry in public if entry[1].startswith("session.next.")]
    shown = [(p["durable"]["seq"], p["type"], p["id"]) for p in replay.replayed]
    assert shown[: len(public)] == public
    failed = [p for p in replay.replayed if p["type"] == TOOL_FAILED]
    assert [p["data"]["callID"] for p in failed] == [observed.tool_id]
    assert failed[0]["data"]["error"] == V2_TOOL_ERROR


def assert_next_turn(turn: NextTurn, observed: Observed) -> None:
    """The short command ran once and completed, the old tool is as settled, the log is whole."""
    assert_settled(tool_in(turn.messages, observed), observed)
    ran = [t for m in turn.messages for t in tools(m) if t["state"]["input"].get("command") == NEXT_COMMAND]
    assert [tool["state"]["status"] for tool in ran] == ["completed"], "the short command did not run once"
    assert_contiguous(turn.events)
    if observed.turn.runtime == "v2":
        assert len(failures(turn.events, observed.tool_id)) == 1
