from __future__ import annotations

from proxy.resume.last_turn import InterruptedCall, last_turn
from rules import V1, V2, V2X
from tests.fixtures.opencode2 import load
from tests.proxy.resume.views import RUNNING_INPUT, v1_settled, v1_tool, v1_user, v1_view, v2_view


def test_a_v1_call_left_running_is_an_interrupted_turn_with_its_agent_and_model() -> None:
    found = last_turn(v1_view(v1_tool("prt_1")), V1, "ses_1")
    assert found.newer is None
    assert found.turn is not None
    assert found.turn.message_id == "msg_002"
    assert found.turn.calls == (
        InterruptedCall("prt_1", "bash", RUNNING_INPUT, still_open=True, status="running"),
    )
    assert (found.turn.agent, found.turn.model) == ("plan", {"providerID": "mock", "modelID": "m"})
    assert found.turn.prompted_by == "msg_001"


def test_a_v1_call_settled_by_write_back_is_still_interrupted_but_no_longer_open() -> None:
    found = last_turn(v1_view(v1_settled("prt_1")), V1, "ses_1")
    assert found.turn is not None
    assert [call.still_open for call in found.turn.calls] == [False]


def test_a_finished_turn_is_not_interrupted() -> None:
    done = v1_tool("prt_1", "completed", output="hello\n")
    assert last_turn(v1_view(done, completed=True), V1, "ses_1").turn is None


def test_a_turn_cut_while_the_model_wrote_has_no_calls() -> None:
    found = last_turn(v1_view({"id": "prt_2", "type": "text", "text": ""}), V1, "ses_1")
    assert found.turn is not None
    assert found.turn.calls == ()


def test_a_user_message_after_the_assistant_message_is_newer() -> None:
    found = last_turn(v1_view(v1_tool("prt_1"), later=[v1_user("msg_003")]), V1, "ses_1")
    assert found.newer == "msg_003"


def test_v2_lists_newest_first_and_keeps_the_model_on_the_message() -> None:
    found = last_turn(v2_view(), V2, "ses_2")
    assert found.turn is not None
    assert (found.turn.message_id, found.turn.prompted_by) == ("msg_002", "msg_001")
    assert found.turn.calls[0].call_id == "call_mock_1"
    assert found.turn.model == {"providerID": "mock", "modelID": "m"}


def test_a_v2_call_settled_as_interrupted_is_not_open_and_another_error_is_not_interrupted() -> None:
    settled = v2_view(
        "error", error={"type": "unknown", "message": "Tool execution interrupted"}, completed=True
    )
    found = last_turn(settled, V2, "ses_2")
    assert found.turn is not None
    assert not found.turn.calls[0].still_open
    failed = v2_view("error", error={"type": "unknown", "message": "exit 1"}, completed=True)
    assert last_turn(failed, V2, "ses_2").turn is None


def test_an_empty_or_odd_view_has_no_turn() -> None:
    assert last_turn([], V1, "ses_1").turn is None
    assert last_turn({"data": "nope"}, V2, "ses_1").turn is None
    assert last_turn([{"info": "x"}, 3], V1, "ses_1").turn is None


def test_a_message_read_cut_off_before_it_was_closed_by_a_write_back_stays_cut_off() -> None:
    closed = v1_view({"id": "prt_2", "type": "text", "text": ""}, completed=True)
    assert last_turn(closed, V1, "ses_1").turn is None
    found = last_turn(closed, V1, "ses_1", cut_off="msg_002")
    assert found.turn is not None
    assert found.turn.calls == ()
    assert last_turn(closed, V1, "ses_1", cut_off="msg_001").turn is None


def test_a_2x_call_2x_settled_itself_is_interrupted_and_no_longer_open() -> None:
    """2.x settles a call a crash left open as `aborted`, naming the tool, where 1.18's v2 says
    `unknown`: read with 2.x's rules, the call is found interrupted and settled."""
    settled = load("assistant-tool-settled-shell.json")
    user = {"id": "msg_1f0a2b3c4e00AbCdEfGhIjKlMn", "type": "user", "text": "go", "time": {"created": 1}}
    view = {"data": [settled, user], "cursor": {}}
    found = last_turn(view, V2X, "ses_2")
    assert found.turn is not None
    given = {"command": "sleep 20 && echo written >> note.txt"}
    assert found.turn.calls == (
        InterruptedCall("call_0002", "shell", given, still_open=False, status="error"),
    )
    assert (found.turn.prompted_by, found.turn.model) == (
        user["id"],
        {"providerID": "provider", "modelID": "model"},
    )
    read_as_1_18 = last_turn(view, V2, "ses_2").turn
    assert read_as_1_18 is not None
    assert read_as_1_18.calls == ()


def test_a_2x_call_the_server_failed_as_ambiguous_is_its_own_settlement_and_refused() -> None:
    """The newest `serve --service` fails a call it will not resume as ambiguous (`restart.ts`):
    read as the server's settlement (never open), with its word kept."""
    settled = load("assistant-tool-settled-shell.json")
    ambiguous = "Tool outcome is ambiguous after restart: shell"
    [tool] = [item for item in settled["content"] if item["type"] == "tool"]
    tool["state"]["error"] = {"type": "aborted", "message": ambiguous}
    user = {"id": "msg_1f0a2b3c4e00AbCdEfGhIjKlMn", "type": "user", "text": "go", "time": {"created": 1}}
    found = last_turn({"data": [settled, user], "cursor": {}}, V2X, "ses_2")
    assert found.turn is not None
    [call] = found.turn.calls
    assert (call.still_open, call.refused) == (False, ambiguous)
    assert V2X.settled_as_interrupted(tool["state"])
