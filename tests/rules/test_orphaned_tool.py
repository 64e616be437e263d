from typing import Any

import pytest

from rules import Api, Doubt, Liveness, apply_changes, settle
from rules.models import V1Message, V2Message
from rules.orphaned_tool import OrphanedTool
from tests.fixtures import load

INACTIVE = Liveness("ses_x", active=False)
ACTIVE = Liveness("ses_x", active=True)


def v2_stale() -> dict[str, Any]:
    message: dict[str, Any] = load("v2-message-stale-running.json")["data"][0]
    return message


def v1_stale() -> dict[str, Any]:
    message: dict[str, Any] = load("v1-message-stale-running.json")[1]
    return message


def test_v2_running_tool_is_settled_like_a_graceful_interrupt() -> None:
    message = v2_stale()
    changes = OrphanedTool()(V2Message.model_validate(message), INACTIVE)
    tool = apply_changes(message, changes)["content"][0]
    interrupted = load("v2-message-interrupted.json")["data"][0]["content"][0]
    assert tool["state"]["status"] == interrupted["state"]["status"] == "error"
    assert tool["state"]["error"] == interrupted["state"]["error"]
    assert set(tool["state"]) == set(interrupted["state"])
    assert tool["state"]["input"] == message["content"][0]["state"]["input"]
    assert tool["time"] == {"created": 1795988584665, "ran": 1795988584703, "completed": 1795988584703}
    assert [change.rule for change in changes] == ["orphaned-tool"]


def test_v1_running_part_is_settled_as_opencode_marks_an_interrupted_call() -> None:
    message = v1_stale()
    changes = OrphanedTool()(V1Message.model_validate(message), INACTIVE)
    part = apply_changes(message, changes)["parts"][1]
    assert part["state"] == {
        "status": "error",
        "input": {"command": "echo hello && sleep 600", "description": "demo"},
        "metadata": {"output": "hello\n", "interrupted": True},
        "time": {"start": 1795988600938, "end": 1795988600938},
        "error": "Tool execution aborted",
    }
    assert {key: part[key] for key in part if key != "state"} == {
        key: message["parts"][1][key] for key in message["parts"][1] if key != "state"
    }


def test_v1_pending_part_without_a_start_gets_both_times_from_the_message() -> None:
    message = v1_stale()
    message["parts"][1]["state"] = {"status": "pending", "input": {}, "raw": ""}
    part = apply_changes(message, OrphanedTool()(V1Message.model_validate(message), INACTIVE))["parts"][1]
    created = message["info"]["time"]["created"]
    assert part["state"]["time"] == {"start": created, "end": created}
    assert part["state"]["raw"] == ""
    assert part["state"]["status"] == "error"


@pytest.mark.parametrize("status", ["streaming", "running"])
def test_v2_open_statuses(status: str) -> None:
    message = v2_stale()
    message["content"][0]["state"]["status"] = status
    assert len(OrphanedTool()(V2Message.model_validate(message), INACTIVE)) == 1


@pytest.mark.parametrize("status", ["completed", "error"])
def test_settled_parts_are_left_alone(status: str) -> None:
    message = v1_stale()
    message["parts"][1]["state"]["status"] = status
    assert OrphanedTool()(V1Message.model_validate(message), INACTIVE) == []


def test_active_session_is_never_touched() -> None:
    assert OrphanedTool()(V2Message.model_validate(v2_stale()), ACTIVE) == []
    assert settle(load("v2-message-busy-running.json")["data"][0], Api.V2, ACTIVE) is None
    assert settle(load("v1-message-busy-running.json")[1], Api.V1, ACTIVE) is None


def test_already_settled_fixtures_need_nothing() -> None:
    for message in load("v2-message-interrupted.json")["data"]:
        assert settle(message, Api.V2, INACTIVE) is None
    for message in load("v1-message-aborted.json"):
        assert settle(message, Api.V1, INACTIVE) is None


def test_a_patched_part_leaves_only_its_message_to_close() -> None:
    """The API cannot close a v1 message, so after a write-back the view still needs its turn ended."""
    settled = [settle(message, Api.V1, INACTIVE) for message in load("v1-message-after-patch.json")]
    rules = [[change.rule for change in found.changes] for found in settled if found is not None]
    assert rules == [["unfinished-message"]]


def test_a_reading_too_close_to_the_tool_vouches_for_nothing() -> None:
    message = v2_stale()
    last_alive = message["content"][0]["time"]["ran"]
    assert settle(message, Api.V2, Liveness("s", active=False, taken_at=last_alive + 1_999)) is None
    assert settle(message, Api.V2, Liveness("s", active=False, taken_at=last_alive + 2_000)) is not None


def test_a_tool_that_may_run_in_another_process_is_left_alone() -> None:
    message = v2_stale()
    last_alive = message["content"][0]["time"]["ran"]
    assert settle(message, Api.V2, Liveness("s", active=False, elsewhere_since=last_alive)) is None
    assert settle(message, Api.V2, Liveness("s", active=False, elsewhere_since=last_alive + 1)) is not None


def test_a_reading_says_why_it_does_not_vouch() -> None:
    assert Liveness("s", active=True).doubt(0) is Doubt.ACTIVE
    assert Liveness("s", active=False, taken_at=1_999, elsewhere_since=0).doubt(0) is Doubt.TOO_RECENT
    assert Liveness("s", active=False, taken_at=2_000, elsewhere_since=0).doubt(0) is Doubt.ELSEWHERE
    assert Liveness("s", active=False, taken_at=2_000, elsewhere_since=1).doubt(0) is None


def test_unknown_fields_survive_in_place() -> None:
    message = v2_stale()
    message["content"][0] = {"future": [1, {"x": None}], **message["content"][0]}
    message["content"][0]["state"]["novel"] = "kept"
    settled = settle(message, Api.V2, INACTIVE)
    assert settled is not None
    tool = settled.message["content"][0]
    assert next(iter(tool)) == "future"
    assert tool["future"] == [1, {"x": None}]
    assert tool["state"]["novel"] == "kept"
    assert list(tool["state"])[:2] == ["status", "input"]


def test_timestamps_are_stable() -> None:
    first = settle(v2_stale(), Api.V2, INACTIVE)
    second = settle(v2_stale(), Api.V2, INACTIVE)
    assert first is not None
    assert second is not None
    assert first.message == second.message
