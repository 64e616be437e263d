"""opencode 2.x's shape: calls and compactions settled as 2.x's own drain settles them.

The messages are 2.x's as its source has them (`packages/schema/src/session-message.ts`
@0ceb3dd56f35, anomalyco/opencode); the running shell call's times are those a client measured
on 2.0.24 after a `kill -9` (see `/work/notes/opencode2x-facts.md`).
"""

from typing import Any

import pytest

from rules import V2, V2X, Api, Liveness, settle, settle_view
from rules.models import V2Message
from rules.runtime_2x import V2xMessage
from rules.runtimes import runtime_for
from tests.fixtures.opencode2 import load

INACTIVE = Liveness("ses_x", active=False)
ACTIVE = Liveness("ses_x", active=True)


def tool(name: str, state: dict[str, Any], **fields: Any) -> dict[str, Any]:
    times = {"created": 1791430444062, "ran": 1791430444073}
    return {"type": "tool", "id": f"call_{name}", "name": name, "state": state, "time": times, **fields}


def assistant(*content: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "msg_a",
        "type": "assistant",
        "agent": "build",
        "model": {"id": "m", "providerID": "p"},
        "content": [{"type": "text", "text": "on it"}, *content],
        "time": {"created": 1791430444000},
    }


def settled(message: dict[str, Any], liveness: Liveness = INACTIVE) -> dict[str, Any]:
    found = settle(message, Api.V2, liveness, runtime=V2X)
    assert found is not None
    return found.message


def test_a_running_call_fails_as_settle_stale_tool_calls_fails_it() -> None:
    running = {"status": "running", "input": {"command": "sleep 600"}, "metadata": {"output": "hello\n"}}
    message = settled(assistant(tool("shell", running, executed=True)))
    call = message["content"][1]
    assert call["state"] == {
        "status": "error",
        "error": {"type": "aborted", "message": "Tool execution interrupted: shell"},
        "input": {"command": "sleep 600"},
        "metadata": {"output": "hello\n"},
    }
    assert call["time"] == {"created": 1791430444062, "ran": 1791430444073, "completed": 1791430444073}
    assert call["executed"] is True


def test_a_subagent_names_its_child_session() -> None:
    running = {"status": "running", "input": {"prompt": "look"}, "metadata": {"sessionID": "ses_child"}}
    call = settled(assistant(tool("subagent", running)))["content"][1]
    assert call["state"]["error"]["message"] == "Tool execution interrupted: subagent (sessionID: ses_child)"
    assert call["executed"] is False


def test_a_streaming_call_fails_with_its_half_input_as_an_empty_object() -> None:
    call = settled(assistant(tool("shell", {"status": "streaming", "input": '{"comm'})))["content"][1]
    assert call["state"] == {
        "status": "error",
        "error": {"type": "aborted", "message": "Tool execution interrupted: shell"},
        "input": {},
    }


def test_what_the_failed_state_does_not_carry_goes() -> None:
    running = {"status": "running", "input": {}, "metadata": {}, "structured": {}, "content": []}
    call = settled(assistant(tool("read", running, providerResultState={"x": 1})))["content"][1]
    assert set(call["state"]) == {"status", "error", "input"}
    assert "providerResultState" not in call


def test_1_18_v2_keeps_its_own_shape_for_the_same_message() -> None:
    running = {"status": "running", "input": {"command": "ls"}, "metadata": {}}
    found = settle(assistant(tool("shell", running)), Api.V2, INACTIVE)
    assert found is not None
    assert found.message["content"][1]["state"]["error"] == {
        "type": "unknown",
        "message": "Tool execution interrupted",
    }


def test_a_live_session_is_left_alone() -> None:
    running = {"status": "running", "input": {}, "metadata": {}}
    assert settle(assistant(tool("shell", running)), Api.V2, ACTIVE, runtime=V2X) is None


def compaction(status: str = "running") -> dict[str, Any]:
    return {
        "id": "msg_c",
        "type": "compaction",
        "status": status,
        "reason": "auto",
        "summary": "so far",
        "recent": "",
        "metadata": {"k": 1},
        "time": {"created": 1791430444000},
    }


def test_a_compaction_left_running_fails_as_settle_stale_compactions_fails_it() -> None:
    assert settled(compaction()) == {
        "id": "msg_c",
        "type": "compaction",
        "status": "failed",
        "reason": "auto",
        "metadata": {"k": 1},
        "time": {"created": 1791430444000},
        "error": {"type": "compaction.interrupted", "message": "Compaction was interrupted"},
    }


def test_only_a_running_compaction_of_2x_is_failed() -> None:
    assert settle(compaction(), Api.V2, ACTIVE, runtime=V2X) is None
    assert settle(compaction("completed"), Api.V2, INACTIVE, runtime=V2X) is None
    assert settle(compaction(), Api.V2, INACTIVE) is None  # 1.18's v2 fails none


def test_a_view_is_settled_in_the_runtime_it_is_given() -> None:
    running = {"status": "running", "input": {}, "metadata": {}}
    view = {"data": [compaction(), assistant(tool("shell", running))], "cursor": {}}
    found = settle_view(view, Api.V2, INACTIVE, runtime=V2X)
    assert found is not None
    assert [change.rule for change in found.changes] == [
        "stale-compaction",
        "orphaned-tool",
        "unfinished-message",
    ]
    assert found.document["cursor"] == {}


def test_messages_are_told_apart_by_the_model_that_validated_them() -> None:
    raw = assistant()
    assert runtime_for(V2xMessage.model_validate(raw)) is V2X
    assert runtime_for(V2Message.model_validate(raw)) is V2
    assert V2X.api is Api.V2


def test_what_2x_settled_is_known_as_interrupted() -> None:
    aborted = {
        "status": "error",
        "error": {"type": "aborted", "message": "Tool execution interrupted: shell"},
    }
    assert V2X.settled_as_interrupted(aborted)
    assert not V2X.settled_as_interrupted(
        {"status": "error", "error": {"type": "unknown", "message": "boom"}}
    )
    assert V2.settled_as_interrupted({"error": {"type": "unknown", "message": "Tool execution interrupted"}})


@pytest.mark.parametrize(
    ("open_file", "settled_file"),
    [
        ("assistant-tool-running.json", "assistant-tool-settled-shell.json"),
        ("assistant-tool-streaming.json", "assistant-tool-settled-streaming.json"),
        ("assistant-subagent-running.json", "assistant-tool-settled-subagent.json"),
    ],
)
def test_the_proxy_settles_as_the_stand_in_built_separately_settles(
    open_file: str, settled_file: str
) -> None:
    """The captures of the 2.x stand-in (`tests/fixtures/opencode-2.x/`, written from the same
    source by other hands): equal but for the call's `time.completed`, which 2.x takes from the
    moment its settle runs (the next drain) and the proxy from the call's last sign of life, and
    the message's, which the captures (the settle's projection alone) leave open."""
    ours = settled(load(open_file))
    theirs = load(settled_file)
    assert ours["time"].pop("completed") == ours["content"][-1]["time"]["completed"]
    for message in (ours, theirs):
        for item in message["content"]:
            item["time"].pop("completed", None)
    assert ours == theirs


def test_a_compaction_fails_as_the_stand_in_fails_it() -> None:
    assert settled(load("compaction-running.json")) == load("compaction-failed.json")


def test_the_settled_view_is_what_a_real_server_settles_measured_on_2092350c() -> None:
    """The view a real v2 build served after a SIGKILL and restart, settled, against what that
    server stored once its next prompt settled it: the same fields, call and message alike closed
    (`time.completed`), the message with no `finish` nor `error`; only the times differ, the
    server's being the moments of its next drain (the call's) and next step (the message's)."""
    ours = settled(load("measured-2092350c-message-after-restart.json")["data"])
    theirs = load("measured-2092350c-message-server-settled.json")["data"]
    ran = ours["content"][0]["time"]["ran"]
    assert (ours["time"]["completed"], ours["content"][0]["time"]["completed"]) == (ran, ran)
    assert theirs["time"]["completed"] > theirs["content"][0]["time"]["completed"] > ran
    for message in (ours, theirs):
        message["time"]["completed"] = message["content"][0]["time"]["completed"] = "closed"
    assert ours == theirs


def test_a_retry_the_message_waited_on_goes_with_it() -> None:
    """`session.step.started` drops the `retry` of the message it closes (`message-updater.ts`
    @2092350cf)."""
    message = load("measured-2092350c-message-after-restart.json")["data"]
    message["retry"] = {"attempt": 2, "error": {"type": "unknown", "message": "overloaded"}}
    assert "retry" not in settled(message)
