from __future__ import annotations

from typing import Any

import pytest

from proxy.opencode.tracker import FollowedEvent
from proxy.resume import candidates as watch_module
from proxy.resume.candidates import BusySessions, Candidate
from rules import Api


def event(kind: str, session: str = "ses_1", **properties: Any) -> FollowedEvent:
    return FollowedEvent("/work", None, kind, {"sessionID": session, **properties})


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def watched(*events: FollowedEvent) -> tuple[BusySessions, list[Candidate]]:
    found: list[Candidate] = []
    watch = BusySessions(found.append, Clock())
    watch.following()
    for each in events:
        watch.event(each)
    return watch, found


def test_sessions_busy_when_the_stream_is_lost_are_handed_on_once() -> None:
    watch, found = watched(
        event("session.status", status={"type": "busy"}),
        event("session.next.tool.called", "ses_2"),
        event("session.status", "ses_3", status={"type": "busy"}),
        event("session.idle", "ses_3"),
    )
    watch.following()
    assert [(c.session_id, c.api, c.directory, c.last_alive) for c in found] == [
        ("ses_1", Api.V1, "/work", 100.0),
        ("ses_2", Api.V2, "/work", 100.0),
    ]
    watch.following()
    assert len(found) == 2


def test_the_first_connection_hands_on_nothing() -> None:
    _, found = watched()
    assert found == []


def test_a_v2_turn_whose_step_ended_with_stop_is_over_but_not_one_that_calls_tools() -> None:
    watch, found = watched(
        event("session.next.step.ended", "ses_1", finish="stop"),
        event("session.next.step.ended", "ses_2", finish="tool-calls"),
    )
    watch.following()
    assert [c.session_id for c in found] == ["ses_2"]


def test_a_permission_asked_and_not_answered_is_handed_on_with_the_session() -> None:
    watch, found = watched(
        event("session.status", status={"type": "busy"}),
        event("permission.asked", id="per_1"),
        event("session.status", "ses_2", status={"type": "busy"}),
        event("question.asked", "ses_2", id="que_1"),
        event("question.replied", "ses_2", requestID="que_1"),
    )
    watch.following()
    assert [(c.session_id, c.waiting_on_person) for c in found] == [
        ("ses_1", "a permission asked"),
        ("ses_2", None),
    ]


def test_a_running_tool_shows_its_session_busy_to_a_proxy_that_started_during_the_turn() -> None:
    part = {"type": "tool", "sessionID": "ses_1", "state": {"status": "running"}}
    done = {"type": "tool", "sessionID": "ses_2", "state": {"status": "completed"}}
    watch, found = watched(
        event("message.part.updated", part=part), event("message.part.updated", "ses_2", part=done)
    )
    watch.following()
    assert [(c.session_id, c.api) for c in found] == [("ses_1", Api.V1)]


def test_the_newest_message_each_busy_session_spoke_of_is_handed_on_with_it() -> None:
    """v1 names it in `message.updated` and in a part, 1.18's v2 and 2.x as `assistantMessageID`:
    whatever the session shows newer than that was made after the crash."""
    watch, found = watched(
        event("message.updated", info={"id": "msg_003", "role": "user", "sessionID": "ses_1"}),
        event("session.status", status={"type": "busy"}),
        event("message.part.updated", part={"id": "prt_1", "messageID": "msg_004", "type": "step-start"}),
        event("message.part.updated", part={"id": "prt_0", "messageID": "msg_002", "type": "text"}),
        event("session.next.tool.called", "ses_2", assistantMessageID="msg_010"),
        event("session.next.step.started", "ses_3", assistantMessageID="msg_020"),
        event("session.next.step.ended", "ses_3", assistantMessageID="msg_020", finish="stop"),
    )
    watch.following()
    assert [(c.session_id, c.seen_message) for c in found] == [("ses_1", "msg_004"), ("ses_2", "msg_010")]


def test_busy_sessions_and_requests_asked_are_kept_for_a_bounded_number(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(watch_module, "REMEMBERED", 3)
    monkeypatch.setattr(watch_module, "ASKED_PER_SESSION", 2)
    watch, found = watched(
        *(event("session.status", f"ses_{n}", status={"type": "busy"}) for n in range(10)),
        *(event("permission.asked", f"ses_{n}", id=f"per_{n}") for n in range(10)),
        *(event("question.asked", "ses_9", id=f"que_{n}") for n in range(10)),
    )
    assert watch.running() == ["ses_7", "ses_8", "ses_9"]
    assert list(watch._asked) == ["ses_7", "ses_8", "ses_9"]
    assert list(watch._asked["ses_9"]) == ["que_8", "que_9"]
    watch.following()
    assert [(c.session_id, c.waiting_on_person) for c in found] == [
        ("ses_7", "a permission asked"),
        ("ses_8", "a permission asked"),
        ("ses_9", "a question asked"),
    ]


def test_a_session_whose_requests_were_all_answered_is_kept_for_them_no_longer() -> None:
    watch, _ = watched(
        *(event("permission.asked", f"ses_{n}", id=f"per_{n}") for n in range(5)),
        *(event("permission.replied", f"ses_{n}", requestID=f"per_{n}") for n in range(4)),
    )
    assert list(watch._asked) == ["ses_4"]
