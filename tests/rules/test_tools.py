"""The cheap checks on raw messages that decide which ones the rules are given at all."""

from typing import Any

import pytest

from rules import Api, needs_settling
from rules.tools import OPEN_STATUSES, has_open_tool, is_open_tool, is_unfinished_assistant, tool_status


def v1(*statuses: str, role: str = "assistant", time: Any = None) -> dict[str, Any]:
    parts = [{"type": "tool", "state": {"status": status}} for status in statuses]
    return {"info": {"role": role, "time": {"created": 1} if time is None else time}, "parts": parts}


def v2(*statuses: str, role: str = "assistant", time: Any = None) -> dict[str, Any]:
    content = [{"type": "tool", "state": {"status": status}} for status in statuses]
    return {"type": role, "time": {"created": 1} if time is None else time, "content": content}


MESSAGES = {Api.V1: v1, Api.V2: v2}


@pytest.mark.parametrize("api", list(Api))
def test_a_tool_in_an_open_status_of_its_runtime_is_open(api: Api) -> None:
    message = MESSAGES[api]
    for status in OPEN_STATUSES[api]:
        assert has_open_tool(message("completed", status), api)
    assert not has_open_tool(message("completed", "error"), api)
    assert not has_open_tool(message(), api)


def test_an_open_status_of_the_other_runtime_is_not() -> None:
    assert not has_open_tool(v1("streaming"), Api.V1)
    assert not has_open_tool(v2("pending"), Api.V2)


@pytest.mark.parametrize(
    "raw",
    [
        None,
        [],
        "parts",
        {"parts": None},
        {"parts": {"state": {"status": "running"}}},
        {"parts": ["running", None, {"state": "running"}, {"state": None}]},
    ],
)
def test_what_is_not_shaped_like_a_message_has_no_open_tool(raw: Any) -> None:
    assert not has_open_tool(raw, Api.V1)


@pytest.mark.parametrize("api", list(Api))
def test_an_assistant_message_without_a_completed_time_is_unfinished(api: Api) -> None:
    message = MESSAGES[api]
    assert is_unfinished_assistant(message(), api)
    assert is_unfinished_assistant(message(time={"created": 1, "completed": None}), api)
    assert not is_unfinished_assistant(message(time={"created": 1, "completed": 2}), api)
    assert not is_unfinished_assistant(message(role="user"), api)
    assert not is_unfinished_assistant(message(time="yesterday"), api)


@pytest.mark.parametrize("raw", [None, [], {"info": None}, {"info": "assistant"}, {"role": "assistant"}])
def test_what_has_no_v1_header_is_not_unfinished(raw: Any) -> None:
    assert not is_unfinished_assistant(raw, Api.V1)


@pytest.mark.parametrize("api", list(Api))
def test_a_message_needs_settling_when_a_tool_is_open_or_it_is_unfinished(api: Api) -> None:
    message = MESSAGES[api]
    done = {"created": 1, "completed": 2}
    assert needs_settling(message("running", time=done), api)
    assert needs_settling(message("completed"), api)
    assert not needs_settling(message("completed", time=done), api)
    assert needs_settling(message("running", role="user", time=done), api)  # whoever's message it is


def test_a_tool_is_open_in_its_own_runtimes_open_statuses_only() -> None:
    def tool(status: object) -> dict[str, object]:
        return {"type": "tool", "state": {"status": status}}

    assert [is_open_tool(tool(s), Api.V1) for s in ("pending", "running", "streaming")] == [
        True,
        True,
        False,
    ]
    assert [is_open_tool(tool(s), Api.V2) for s in ("streaming", "running", "pending")] == [
        True,
        True,
        False,
    ]
    for other in ({"type": "text", "state": {"status": "running"}}, {"type": "tool"}, tool(None), "running"):
        assert tool_status(other) is None
        assert not is_open_tool(other, Api.V1)
