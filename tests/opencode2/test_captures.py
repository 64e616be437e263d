"""The stand-in settles the derived 2.x shapes (tests/fixtures/opencode-2.x/) into the settled ones, so the
shapes the rules are tested against and the server the proxy is tested against say the same."""

from __future__ import annotations

import copy

import pytest

from tests.fixtures.opencode2 import load
from tests.opencode2.settle import (
    Settle,
    compaction_failures,
    project_compaction_failed,
    project_tool_failed,
    tool_failures,
)

SESSION = "ses_1f0a2b3c4d5eFf6g7h8i9j0k1l"


@pytest.mark.parametrize(
    ("running", "name", "settle"),
    [
        ("assistant-tool-running.json", "shell", Settle.CHILD),
        ("assistant-tool-streaming.json", "streaming", Settle.CHILD),
        ("assistant-subagent-running.json", "subagent", Settle.CHILD),
        ("assistant-subagent-running.json", "subagent-early", Settle.EARLY),
    ],
)
def test_a_stale_call_settles_into_the_settled_shape(running: str, name: str, settle: Settle) -> None:
    messages = [copy.deepcopy(load(running))]
    event = load(f"event-tool-failed-{name}.json")
    [published] = tool_failures(SESSION, messages, settle)
    assert (published.type, published.data) == (event["type"], event["data"])
    project_tool_failed(messages, published.data, event["created"])
    assert messages == [load(f"assistant-tool-settled-{name}.json")]


def test_a_stale_compaction_fails_into_the_failed_shape() -> None:
    messages = [copy.deepcopy(load("compaction-running.json"))]
    [published] = compaction_failures(SESSION, messages)
    assert published.data == load("event-compaction-failed.json")["data"]
    project_compaction_failed(messages, published.data)
    assert messages == [load("compaction-failed.json")]


def test_the_measured_2_0_24_settle_matches_the_derived_one() -> None:
    """A real 2.0.24 turned its running `shell` call into what the derivation says, `ran` kept."""
    measured = load("measured-2.0.24-rows.json")
    after = measured["rows_final"][1]["tool"]
    settled = load("assistant-tool-settled-shell.json")["content"][0]
    assert after["status"] == settled["state"]["status"]
    assert after["error"] == settled["state"]["error"]
    assert after["ran"] == settled["time"]["ran"]


def test_the_stand_in_settles_as_a_real_v2_server_settled_measured_on_2092350c() -> None:
    """The stand-in's settle, on the call a real v2 build left running across a SIGKILL, publishes
    the event that server published on its next prompt and projects it into the message it stored
    (the call's part of it: the message is closed by the next step, `store.run_turn`)."""
    running = load("measured-2092350c-message-after-restart.json")["data"]
    events = load("measured-2092350c-events-next-prompt.json")
    failed = next(event for event in events if event["type"] == "session.tool.failed")
    session = failed["data"]["sessionID"]
    messages = [copy.deepcopy(running)]
    [published] = tool_failures(session, messages, Settle.CHILD)
    assert (published.type, published.data) == (failed["type"], failed["data"])
    project_tool_failed(messages, published.data, failed["created"])
    settled = load("measured-2092350c-message-server-settled.json")["data"]
    assert messages[0]["content"] == settled["content"]
