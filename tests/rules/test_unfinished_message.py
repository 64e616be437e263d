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


def test_message_without_open_tool_is_not_closed() -> None:
    message = load("v2-message-stale-running.json")["data"][0]
    message["content"][0]["state"]["status"] = "completed"
    assert UnfinishedMessage()(V2Message.model_validate(message), INACTIVE) == []
