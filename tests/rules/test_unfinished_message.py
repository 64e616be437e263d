from rules import Api, Liveness, settle
from rules.models import V1Message, V2Message
from rules.unfinished_message import UnfinishedMessage
from tests.fixtures import load

INACTIVE = Liveness("ses_x", active=False)


def test_v2_message_gets_completed_when_its_tool_is_settled() -> None:
    message = load("v2-message-stale-running.json")["data"][0]
    settled = settle(message, Api.V2, INACTIVE)
    assert settled is not None
    assert settled.message["time"] == {"created": 1795988584653, "completed": 1795988584703}
    assert settled.message["time"]["completed"] == settled.message["content"][0]["time"]["completed"]


def test_v1_message_gets_completed_and_the_abort_error() -> None:
    message = load("v1-message-stale-running.json")[1]
    settled = settle(message, Api.V1, INACTIVE)
    assert settled is not None
    info = settled.message["info"]
    assert info["time"] == {"created": 1795988598698, "completed": 1795988600938}
    assert info["error"] == {"name": "MessageAbortedError", "data": {"message": "Aborted"}}
    assert list(info)[:3] == ["id", "sessionID", "role"]


def test_existing_v1_error_is_kept() -> None:
    message = load("v1-message-stale-running.json")[1]
    message["info"]["error"] = {"name": "APIError", "data": {"message": "boom"}}
    changes = UnfinishedMessage()(V1Message.model_validate(message), INACTIVE)
    assert changes[0].patch == {"time": {"completed": 1795988600938}}


def test_user_and_completed_messages_are_left_alone() -> None:
    user = load("v2-message-stale-running.json")["data"][1]
    assert UnfinishedMessage()(V2Message.model_validate(user), INACTIVE) == []
    done = load("v2-message-stale-running.json")["data"][0]
    done["time"]["completed"] = 1
    assert [c.rule for c in settle(done, Api.V2, INACTIVE).changes] == ["orphaned-tool"]  # type: ignore[union-attr]


def test_message_without_open_tool_is_closed_too() -> None:
    """A server killed while the model still wrote text leaves the turn open with no tool in it."""
    message = load("v2-message-stale-running.json")["data"][0]
    message["content"][0]["state"]["status"] = "completed"
    message["content"][0]["time"]["completed"] = 1795988590000
    changes = UnfinishedMessage()(V2Message.model_validate(message), INACTIVE)
    assert [change.patch for change in changes] == [{"time": {"completed": 1795988590000}}]


def test_v1_text_only_turn_is_closed_at_its_last_sign_of_life() -> None:
    message = load("v1-message-stale-running.json")[1]
    message["parts"] = [
        {"id": "prt_a", "type": "step-start"},
        {"id": "prt_b", "type": "text", "text": "", "time": {"start": 1795988599000}},
    ]
    settled = settle(message, Api.V1, INACTIVE)
    assert settled is not None
    assert settled.message["info"]["time"] == {"created": 1795988598698, "completed": 1795988599000}
    assert [change.rule for change in settled.changes] == ["unfinished-message"]


def test_a_live_or_fresh_turn_is_not_closed() -> None:
    message = load("v1-message-stale-running.json")[1]
    assert settle(message, Api.V1, Liveness("s", active=True)) is None
    assert settle(message, Api.V1, Liveness("s", active=False, taken_at=1795988600938 + 1000)) is None
