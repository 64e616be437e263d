"""One object per runtime holds what differs between v1 and v2."""

from typing import Any

import pytest

from rules import OPEN_STATUSES, V1, V2, Api, Runtime, UnexpectedShape, runtime_for, runtime_of
from rules.models import V1Message, V2Message
from rules.runtimes import V1_ABORTED, V2_ERROR

V1_RAW = {
    "info": {"id": "m1", "role": "assistant", "time": {"created": 10}},
    "parts": [
        {"id": "p0", "type": "text", "time": {"start": 11, "end": 12}},
        {
            "id": "p1",
            "type": "tool",
            "tool": "bash",
            "callID": "c1",
            "state": {"status": "running", "time": {"start": 20}},
        },
        {"id": "p2", "type": "tool", "tool": "read", "state": {"status": "pending"}},
        {"id": "p3", "type": "tool", "state": {"status": "completed", "time": {"start": 21, "end": 30}}},
    ],
}
V2_RAW = {
    "id": "m2",
    "type": "assistant",
    "time": {"created": 10},
    "content": [
        {"type": "text"},
        {
            "id": "c1",
            "type": "tool",
            "name": "bash",
            "state": {"status": "streaming"},
            "time": {"created": 15},
        },
        {"id": "c2", "type": "tool", "state": {"status": "running"}, "time": {"created": 15, "ran": 25}},
        {"id": "c3", "type": "tool", "state": {"status": "completed"}, "time": {"completed": 40}},
    ],
}


def test_runtime_of_and_for() -> None:
    assert runtime_of(Api.V1) is V1
    assert runtime_of(Api.V2) is V2
    assert runtime_for(V1Message.model_validate(V1_RAW)) is V1
    assert runtime_for(V2Message.model_validate(V2_RAW)) is V2
    assert {api: runtime_of(api).open_statuses for api in Api} == OPEN_STATUSES
    assert (V1.item_key, V1.role_key, V1.tool_key) == ("parts", "role", "tool")
    assert (V2.item_key, V2.role_key, V2.tool_key) == ("content", "type", "name")
    assert V1.model is V1Message
    assert V2.model is V2Message


def test_raw_reading() -> None:
    assert V1.header(V1_RAW) is V1_RAW["info"]
    assert V1.message_id(V1_RAW) == "m1"
    assert V2.header(V2_RAW) is V2_RAW
    assert V2.message_id(V2_RAW) == "m2"


def test_v1_message_facts_and_settled_shapes() -> None:
    message = V1Message.model_validate(V1_RAW)
    assert V1.open_tool_indexes(message) == [1, 2]
    assert V1.last_alive(message) == 30
    assert V1.is_assistant(message)
    assert not V1.completed(message)
    assert V1.settled_tool(message, 1)["state"]["time"] == {"end": 20}
    assert V1.settled_tool(message, 2)["state"]["time"] == {"start": 10, "end": 10}
    assert V1.finished(message, 30) == {"time": {"completed": 30}, "error": V1_ABORTED}
    assert (V1.target(message, 1).call, V1.target(message, 2).call) == ("c1", None)
    assert V1.header_path == ("info",)


def test_v2_message_facts_and_settled_shapes() -> None:
    message = V2Message.model_validate(V2_RAW)
    assert V2.open_tool_indexes(message) == [1, 2]
    assert V2.last_alive(message) == 40
    assert V2.settled_tool(message, 1) == {
        "state": {"status": "error", "error": V2_ERROR},
        "time": {"completed": 15},
    }
    assert V2.settled_tool(message, 2)["time"] == {"completed": 25}
    assert V2.finished(message, 40) == {"time": {"completed": 40}}
    assert V2.target(message, 1).tool == "bash"
    assert V2.target(message, 2).tool is None
    assert V2.header_path == ()


def test_views() -> None:
    assert V1.messages_of([V1_RAW], single=False) == [V1_RAW]
    assert V1.with_messages([], [V1_RAW], single=True) is V1_RAW
    document = {"data": [V2_RAW], "cursor": {"next": "x"}}
    assert V2.messages_of(document, single=False) == [V2_RAW]
    assert V2.with_messages(document, [1], single=False) == {"data": [1], "cursor": {"next": "x"}}
    wrong: list[tuple[Runtime[Any], object]] = [(V1, {"data": []}), (V2, []), (V2, {"data": {}})]
    for runtime, shape in wrong:
        with pytest.raises(UnexpectedShape):
            runtime.messages_of(shape, single=False)
