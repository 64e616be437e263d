"""Typed targets: every change names its message, part, call and tool; callers never decode paths."""

from rules import Api, Liveness, OpenTool, Target, settle, settle_view
from tests.fixtures import load

INACTIVE = Liveness("ses_x", active=False)
V1_MESSAGE = "msg_229432faa0010ifWjJPo42f8Zo"
V1_PART = "prt_229433856001UdZM6dtgAYZqVe"


def test_v1_changes_name_the_part_its_call_and_tool() -> None:
    settlement = settle(load("v1-message-stale-running.json")[1], Api.V1, INACTIVE)
    assert settlement is not None
    tool, message = settlement.changes
    assert tool.target == Target(V1_MESSAGE, V1_PART, "call_mock_6", "bash")
    assert tool.on_tool
    assert tool.target.key == V1_PART
    assert message.target == Target(V1_MESSAGE)
    assert not message.on_tool
    assert message.target.key == V1_MESSAGE


def test_settled_returns_the_object_a_change_settled() -> None:
    settlement = settle(load("v1-message-stale-running.json")[1], Api.V1, INACTIVE)
    assert settlement is not None
    tool, message = settlement.changes
    assert settlement.settled(tool)["id"] == V1_PART
    assert settlement.settled(tool)["state"]["status"] == "error"
    assert settlement.settled(message)["id"] == V1_MESSAGE
    assert settlement.settled(message)["time"]["completed"] is not None


def test_v2_call_is_the_item_id() -> None:
    view = settle_view(load("v2-message-stale-running.json"), Api.V2, INACTIVE)
    assert view is not None
    tool = view.changes[0]
    assert (tool.target.part, tool.target.call, tool.target.tool) == ("call_mock_1", "call_mock_1", "bash")
    assert view.messages.settled[0][1].settled(tool)["state"]["status"] == "error"


def test_targets_without_a_tool_name_or_call_id() -> None:
    message = {
        "info": {"id": "m", "role": "assistant", "time": {"created": 1, "completed": 2}},
        "parts": [{"id": "p", "type": "tool", "tool": 7, "state": {"status": "running"}}],
    }
    settlement = settle(message, Api.V1, INACTIVE)
    assert settlement is not None
    assert settlement.changes[0].target == Target("m", "p", None, None)


def test_open_tool_names_where_it_lives() -> None:
    tool = OpenTool(Api.V2, "ses", "msg", "call", "bash", since=5, directory="/d")
    assert (tool.part, tool.since, tool.project) == ("call", 5, None)
