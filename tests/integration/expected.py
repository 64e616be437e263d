"""The settled shapes opencode 1.18.33 itself writes, as the integration suites expect them.

Stated here from the captures (`tests/fixtures/opencode-1.18.33/`), not imported from the
rules, so a wrong rule cannot make its own test pass.
"""

from __future__ import annotations

from typing import Any

V1_PART_ERROR = "Tool execution aborted"
V2_TOOL_ERROR = {"type": "unknown", "message": "Tool execution interrupted"}
V1_MESSAGE_ERROR = {"name": "MessageAbortedError", "data": {"message": "Aborted"}}


def _by_id(items: list[dict[str, Any]], item_id: str) -> dict[str, Any]:
    matches = [item for item in items if item.get("id") == item_id]
    assert len(matches) == 1, f"{item_id} appears {len(matches)} times"
    return matches[0]


def _kept(direct: dict[str, Any], proxied: dict[str, Any], *, except_keys: set[str]) -> None:
    """Every field of `direct` outside `except_keys` is in `proxied` with the same value."""
    for key, value in direct.items():
        if key not in except_keys:
            assert proxied.get(key) == value, f"field {key!r} changed: {value!r} -> {proxied.get(key)!r}"


def assert_v2_settled(direct: dict[str, Any], proxied: dict[str, Any], call_id: str) -> None:
    """The v2 item looks like opencode's own interrupt: error state, both `time.completed` set."""
    d_tool, p_tool = _by_id(direct["content"], call_id), _by_id(proxied["content"], call_id)
    state = p_tool["state"]
    assert state["status"] == "error"
    assert state["error"] == V2_TOOL_ERROR
    _kept(d_tool["state"], state, except_keys={"status"})
    _kept(d_tool, p_tool, except_keys={"state", "time"})
    _kept(d_tool["time"], p_tool["time"], except_keys=set())
    assert p_tool["time"]["completed"] >= p_tool["time"]["ran"]
    assert proxied["time"]["completed"] >= p_tool["time"]["completed"]
    _kept(direct, proxied, except_keys={"time", "content"})
    _kept(direct["time"], proxied["time"], except_keys=set())
    assert [c for c in proxied["content"] if c.get("id") != call_id] == [
        c for c in direct["content"] if c.get("id") != call_id
    ]


def assert_v1_settled(direct: dict[str, Any], proxied: dict[str, Any], part_id: str) -> None:
    """The v1 part looks like opencode's in-process cleanup; the message like a graceful abort."""
    d_part, p_part = _by_id(direct["parts"], part_id), _by_id(proxied["parts"], part_id)
    state, d_state = p_part["state"], d_part["state"]
    assert state["status"] == "error"
    assert state["error"] == V1_PART_ERROR
    assert state["metadata"]["interrupted"] is True
    assert state["metadata"]["output"] == d_state["metadata"]["output"]
    assert state["input"] == d_state["input"]
    assert state["time"]["start"] == d_state["time"]["start"]
    assert state["time"]["end"] >= state["time"]["start"]
    _kept(d_part, p_part, except_keys={"state"})
    assert [p for p in proxied["parts"] if p["id"] != part_id] == [
        p for p in direct["parts"] if p["id"] != part_id
    ]
    info, d_info = proxied["info"], direct["info"]
    assert info["time"]["completed"] >= info["time"]["created"]
    assert info["error"] == V1_MESSAGE_ERROR
    _kept(d_info, info, except_keys={"time"})
    _kept(d_info["time"], info["time"], except_keys=set())
