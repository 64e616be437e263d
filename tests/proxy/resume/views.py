"""Message views of the two runtimes, as opencode 1.18.33 stores a turn a crash cut off."""

from __future__ import annotations

from typing import Any

RUNNING_INPUT = {"command": "echo hello && sleep 600", "description": "demo"}


def v1_tool(part_id: str, status: str = "running", **state: Any) -> dict[str, Any]:
    return {
        "id": part_id,
        "type": "tool",
        "tool": state.pop("tool", "bash"),
        "callID": "call_1",
        "state": {"status": status, "input": RUNNING_INPUT, "time": {"start": 1}, **state},
    }


def v1_settled(part_id: str) -> dict[str, Any]:
    return v1_tool(
        part_id, "error", error="Tool execution aborted", metadata={"output": "hello\n", "interrupted": True}
    )


def v1_view(
    *parts: dict[str, Any], completed: bool = False, later: list[dict[str, Any]] | None = None
) -> Any:
    time: dict[str, int] = {"created": 2, **({"completed": 3} if completed else {})}
    assistant = {
        "id": "msg_002",
        "role": "assistant",
        "sessionID": "ses_1",
        "time": time,
        "agent": "plan",
        "mode": "plan",
        "providerID": "mock",
        "modelID": "m",
    }
    return [
        {
            "info": {"id": "msg_001", "role": "user", "sessionID": "ses_1", "time": {"created": 1}},
            "parts": [],
        },
        {"info": assistant, "parts": [{"id": "prt_0", "type": "step-start"}, *parts]},
        *(later or []),
    ]


def v1_user(message_id: str) -> dict[str, Any]:
    return {
        "info": {"id": message_id, "role": "user", "sessionID": "ses_1", "time": {"created": 9}},
        "parts": [],
    }


def v2_view(status: str = "running", *, error: Any = None, completed: bool = False) -> Any:
    state: dict[str, Any] = {"status": status, "input": RUNNING_INPUT}
    if error is not None:
        state["error"] = error
    time: dict[str, int] = {"created": 2, **({"completed": 3} if completed else {})}
    assistant = {
        "id": "msg_002",
        "type": "assistant",
        "time": time,
        "agent": "build",
        "model": {"id": "m", "providerID": "mock", "variant": "default"},
        "content": [
            {"type": "tool", "id": "call_mock_1", "name": "bash", "state": state, "time": {"ran": 1}}
        ],
    }
    user = {"id": "msg_001", "type": "user", "text": "run the demo", "time": {"created": 1}}
    return {"data": [assistant, user], "cursor": {}}
