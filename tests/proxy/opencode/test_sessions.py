"""Transitions: decoded once per event, each listener's sense of a turn kept apart."""

from __future__ import annotations

from typing import Any

from proxy.opencode.followed_events import FollowedEvent
from proxy.opencode.sessions import (
    MessageCompleted,
    MessageUnfinished,
    PersonAnswered,
    PersonAsked,
    SessionEvent,
    SessionIdle,
    StatusShown,
    TurnRunning,
    TurnStopped,
)
from rules import Api


def event(kind: str, *, line_2x: bool = False, **properties: Any) -> FollowedEvent:
    return FollowedEvent("/w", None, kind, properties, line_2x=line_2x)


def test_every_listener_is_handed_the_transitions_decoded_once() -> None:
    busy = event("session.status", sessionID="ses_a", status={"type": "busy"})
    assert busy.transitions is busy.transitions
    assert busy == event("session.status", sessionID="ses_a", status={"type": "busy"})


def test_a_status_unknown_here_is_busy_for_the_memory_and_over_for_the_resume() -> None:
    compacting = event("session.status", sessionID="ses_a", status={"type": "compacting"})
    assert set(compacting.transitions) == {
        SessionEvent("ses_a", Api.V1, None),
        StatusShown("ses_a", None, "/w", None),
        TurnStopped("ses_a"),
    }


def test_a_2x_execution_cut_by_a_shutdown_ends_the_turn_yet_leaves_it_running_for_the_resume() -> None:
    cut = event("session.execution.interrupted", line_2x=True, sessionID="ses_a", reason="shutdown")
    assert SessionIdle("ses_a", line_2x=True) in cut.transitions
    assert TurnRunning("ses_a", Api.V2, "/w", line_2x=True) in cut.transitions


def test_a_person_is_asked_and_answered_by_request() -> None:
    asked = event("permission.asked", sessionID="ses_a", id="per_1")
    replied = event("permission.v2.replied", sessionID="ses_a", requestID="per_1")
    assert PersonAsked("ses_a", "per_1", "permission") in asked.transitions
    assert PersonAnswered("ses_a", "per_1") in replied.transitions


def test_a_message_whose_time_is_no_object_changes_nothing_and_stops_nothing() -> None:
    odd = event("message.updated", sessionID="ses_a", info={"id": "msg_1", "role": "assistant", "time": 5})
    assert not any(isinstance(change, MessageCompleted | MessageUnfinished) for change in odd.transitions)
