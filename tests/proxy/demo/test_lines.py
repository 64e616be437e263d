"""How the demo reads each line's answers: which opencode `--version` names, the call in a message
view as the servers serve it (captures), and in the events the proxy tells (its own builders)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.demo.lines import Call, Line1x, Line2x, line_of
from proxy.opencode.events_2x import api_tool_failed
from proxy.opencode.vocabulary import part_settled
from tests.fixtures import load

FIXTURES_2X = "tests/fixtures/opencode-2.x"


@pytest.mark.parametrize(
    ("printed", "line", "version"),
    [
        ("1.18.33\n", Line1x, "1.18.33"),
        ("opencode v2.1.2", Line2x, "2.1.2"),
        ("opencode 2.0.19", Line2x, "2.0.19"),
    ],
)
def test_the_line_is_told_by_the_version_printed(printed: str, line: type, version: str) -> None:
    found = line_of(printed)
    assert found is not None
    assert isinstance(found[0], line)
    assert found[1] == version


@pytest.mark.parametrize(
    "printed", ["", "0.15.2", "opencode v3.0.0", "true (GNU coreutils) 9.1", "node 1.2.3"]
)
def test_anything_else_is_no_line(printed: str) -> None:
    assert line_of(printed) is None


def test_a_v1_view_shows_the_bash_call_running_then_aborted() -> None:
    line = Line1x()
    running = line.call_in(load("v1-message-stale-running.json"))
    settled = line.call_in(load("v1-message-after-patch.json"))
    assert running is not None
    assert (running.status, running.error) == ("running", None)
    assert settled == Call(running.id, "error", "Tool execution aborted")


def test_a_v1_client_stream_is_told_by_the_part_updated() -> None:
    line = Line1x()
    [message] = [m for m in load("v1-message-after-patch.json") if m["info"]["role"] == "assistant"]
    part = next(p for p in message["parts"] if p["type"] == "tool")
    told = part_settled(message["info"]["sessionID"], part, message["info"])
    frames = [{"directory": "/project", "payload": event} for event in told]
    assert [line.call_event(frame, part["id"]) for frame in frames] == [
        Call(part["id"], "error", "Tool execution aborted"),
        None,
        None,
    ]
    assert line.call_event(frames[0], "prt_another") is None


def _settled_2x() -> dict[str, Any]:
    with open(f"{FIXTURES_2X}/assistant-tool-settled-shell.json", "rb") as capture:
        message: dict[str, Any] = orjson.loads(capture.read())
    return message


@pytest.mark.parametrize("key", ["id", "callID"])
def test_a_2x_client_stream_is_told_by_tool_failed(key: str) -> None:
    message = _settled_2x()
    item = message["content"][0]
    event = api_tool_failed("ses_1", message["id"], item, key=key)
    assert Line2x().call_event(event, item["id"]) == Call(
        item["id"], "error", "Tool execution interrupted: shell"
    )
    assert Line2x().call_event(event, "call_another") is None


def test_a_2x_view_shows_the_shell_call() -> None:
    message = _settled_2x()
    assert Line2x().call_in({"data": [message]}) == Call(
        "call_0002", "error", "Tool execution interrupted: shell"
    )
