"""Transitions: decoded once per event, each listener's sense of a turn kept apart; and for each event
kind of both lines (1.18's `/global/event`, 2.x's `/api/event`), one row: an event and what it changes."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.opencode.followed_events import FollowedEvent
from proxy.opencode.sessions import (
    CallClosed,
    CallOpened,
    MessageCompleted,
    MessageMentioned,
    MessageUnfinished,
    PartNotOpen,
    PartOpen,
    PersonAnswered,
    PersonAsked,
    SessionEvent,
    SessionIdle,
    StatusShown,
    Transition,
    TurnRunning,
    TurnStopped,
)
from proxy.opencode.vocabulary import EVENT_PREFIXES, EVENT_TYPES
from rules import Api, OpenTool


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


S, M, C, P = "ses_a", "msg_1", "call_1", "prt_1"
ON_1_18: dict[str, Any] = {"sessionID": S}
ON_2X: dict[str, Any] = {"sessionID": S, "assistantMessageID": M}


def shown(kind: str, *, line_2x: bool = False, **properties: Any) -> FollowedEvent:
    """An event as the follower reads it: 1.18's from `/global/event` (with its project), 2.x's
    from `/api/event` (which names none)."""
    return FollowedEvent("/w", None if line_2x else "prj", kind, properties, line_2x=line_2x)


def tool_part(status: str, kind: str = "tool") -> dict[str, Any]:
    return {
        "id": P,
        "sessionID": S,
        "messageID": M,
        "type": kind,
        "tool": "bash",
        "state": {"status": status},
    }


def assistant(time: dict[str, int], role: str = "assistant") -> dict[str, Any]:
    return {"id": M, "sessionID": S, "role": role, "time": time}


RUNNING_V2_ON_1_18 = (SessionEvent(S, Api.V2, None), TurnRunning(S, Api.V2, "/w", line_2x=False))
RUNNING_2X = (SessionEvent(S, Api.V2, None), TurnRunning(S, Api.V2, "/w", line_2x=True))
ENDED_2X = (SessionEvent(S, Api.V2, False), TurnStopped(S), SessionIdle(S, line_2x=True))
OPEN_PART = OpenTool(Api.V1, S, M, P, "bash", directory="/w", project="prj")

TABLE: list[tuple[str, FollowedEvent, tuple[Transition, ...]]] = [
    # 1.18's `/global/event`: v1 sessions
    (
        "v1 status busy",
        shown("session.status", **ON_1_18, status={"type": "busy"}),
        (
            SessionEvent(S, Api.V1, True),
            TurnRunning(S, Api.V1, "/w", False),
            StatusShown(S, True, "/w", "prj"),
        ),
    ),
    (
        "v1 status retry",
        shown("session.status", **ON_1_18, status={"type": "retry"}),
        (
            SessionEvent(S, Api.V1, True),
            TurnRunning(S, Api.V1, "/w", False),
            StatusShown(S, True, "/w", "prj"),
        ),
    ),
    (
        "v1 status idle",
        shown("session.status", **ON_1_18, status={"type": "idle"}),
        (
            SessionEvent(S, Api.V1, False),
            TurnStopped(S),
            SessionIdle(S, line_2x=False),
            StatusShown(S, False, "/w", "prj"),
        ),
    ),
    (
        "v1 status unknown here",
        shown("session.status", **ON_1_18, status={"type": "compacting"}),
        (SessionEvent(S, Api.V1, None), TurnStopped(S), StatusShown(S, None, "/w", "prj")),
    ),
    (
        "v1 session.idle",
        shown("session.idle", **ON_1_18),
        (SessionEvent(S, Api.V1, False), TurnStopped(S), SessionIdle(S, line_2x=False)),
    ),
    ("v1 session.error", shown("session.error", **ON_1_18), (TurnStopped(S), SessionIdle(S, line_2x=False))),
    (
        "assistant message unfinished",
        shown("message.updated", **ON_1_18, info=assistant({"created": 1})),
        (MessageUnfinished(S, M, "/w", "prj"), MessageMentioned(S, M)),
    ),
    (
        "assistant message completed",
        shown("message.updated", **ON_1_18, info=assistant({"created": 1, "completed": 2})),
        (MessageCompleted(M), MessageMentioned(S, M)),
    ),
    (
        "user message",
        shown("message.updated", **ON_1_18, info=assistant({"created": 1}, role="user")),
        (MessageMentioned(S, M),),
    ),
    (
        "v1 tool part running",
        shown("message.part.updated", **ON_1_18, part=tool_part("running")),
        (PartOpen(OPEN_PART), TurnRunning(S, Api.V1, "/w", False), MessageMentioned(S, M)),
    ),
    (
        "v1 tool part pending",
        shown("message.part.updated", **ON_1_18, part=tool_part("pending")),
        (PartOpen(OPEN_PART), TurnRunning(S, Api.V1, "/w", False), MessageMentioned(S, M)),
    ),
    (
        "v1 tool part completed",
        shown("message.part.updated", **ON_1_18, part=tool_part("completed")),
        (PartNotOpen(P), MessageMentioned(S, M)),
    ),
    (
        "v1 text part",
        shown("message.part.updated", **ON_1_18, part=tool_part("running", kind="text")),
        (PartNotOpen(P), MessageMentioned(S, M)),
    ),
    (
        "v1 part removed",
        shown("message.part.removed", **ON_1_18, messageID=M, partID=P),
        (MessageMentioned(S, M),),
    ),
    (
        "permission asked",
        shown("permission.asked", **ON_1_18, id="per_1"),
        (PersonAsked(S, "per_1", "permission"),),
    ),
    (
        "permission replied",
        shown("permission.replied", **ON_1_18, requestID="per_1"),
        (PersonAnswered(S, "per_1"),),
    ),
    (
        "question asked",
        shown("question.asked", **ON_1_18, id="que_1"),
        (PersonAsked(S, "que_1", "question"),),
    ),
    (
        "question rejected",
        shown("question.rejected", **ON_1_18, requestID="que_1"),
        (PersonAnswered(S, "que_1"),),
    ),
    # 1.18's `/global/event`: v2 sessions (`session.next.*`), calls under `callID`
    (
        "v2 call called",
        shown("session.next.tool.called", **ON_2X, callID=C),
        (CallOpened(S, C, M, "callID", "/w", line_2x=False), *RUNNING_V2_ON_1_18, MessageMentioned(S, M)),
    ),
    *(
        (
            f"v2 call input {stage} (the call opens only when called)",
            shown(f"session.next.tool.input.{stage}", **ON_2X, callID=C),
            (*RUNNING_V2_ON_1_18, MessageMentioned(S, M)),
        )
        for stage in ("started", "ended")
    ),
    *(
        (
            f"v2 call ended: {end}",
            shown(f"session.next.tool.{end}", **ON_2X, callID=C),
            (CallClosed(S, C, line_2x=False), *RUNNING_V2_ON_1_18, MessageMentioned(S, M)),
        )
        for end in ("success", "failed", "error")
    ),
    (
        "v2 prompt admitted",
        shown("session.next.prompt.admitted", sessionID=S),
        RUNNING_V2_ON_1_18,
    ),
    (
        "v2 step ended calling tools",
        shown("session.next.step.ended", **ON_2X, finish="tool-calls"),
        (*RUNNING_V2_ON_1_18, MessageMentioned(S, M)),
    ),
    (
        "v2 step ended the turn",
        shown("session.next.step.ended", **ON_2X, finish="stop"),
        (SessionEvent(S, Api.V2, None), TurnStopped(S), MessageMentioned(S, M)),
    ),
    ("1.18 server.connected", shown("server.connected"), ()),
    # 2.x's `/api/event`: calls under `id` (newer) or `callID`
    (
        "2.x call input started",
        shown("session.tool.input.started", line_2x=True, **ON_2X, id=C, name="shell"),
        (CallOpened(S, C, M, "id", "/w", line_2x=True), *RUNNING_2X, MessageMentioned(S, M)),
    ),
    (
        "2.x call called, under callID",
        shown("session.tool.called", line_2x=True, **ON_2X, callID=C),
        (CallOpened(S, C, M, "callID", "/w", line_2x=True), *RUNNING_2X, MessageMentioned(S, M)),
    ),
    *(
        (
            f"2.x call ended: {end}",
            shown(f"session.tool.{end}", line_2x=True, **ON_2X, id=C),
            (CallClosed(S, C, line_2x=True), *RUNNING_2X, MessageMentioned(S, M)),
        )
        for end in ("success", "failed")
    ),
    (
        "2.x call progress",
        shown("session.tool.progress", line_2x=True, **ON_2X, id=C),
        (*RUNNING_2X, MessageMentioned(S, M)),
    ),
    ("2.x execution started", shown("session.execution.started", line_2x=True, sessionID=S), RUNNING_2X),
    *(
        (f"2.x execution {end}", shown(f"session.execution.{end}", line_2x=True, sessionID=S), ENDED_2X)
        for end in ("succeeded", "failed", "interrupted")
    ),
    (
        "2.x execution cut by a shutdown",
        shown("session.execution.interrupted", line_2x=True, sessionID=S, reason="shutdown"),
        (SessionEvent(S, Api.V2, False), TurnRunning(S, Api.V2, "/w", True), SessionIdle(S, line_2x=True)),
    ),
    (
        "2.x permission asked",
        shown("permission.asked", line_2x=True, sessionID=S, id="per_1"),
        (PersonAsked(S, "per_1", "permission"),),
    ),
    (
        "2.x permission replied",
        shown("permission.replied", line_2x=True, sessionID=S, requestID="per_1"),
        (PersonAnswered(S, "per_1"),),
    ),
    ("2.x server.connected", shown("server.connected", line_2x=True), ()),
]


@pytest.mark.parametrize(("event", "expected"), [row[1:] for row in TABLE], ids=[row[0] for row in TABLE])
def test_each_event_kind_of_both_lines_makes_its_transitions(
    event: FollowedEvent, expected: tuple[Transition, ...]
) -> None:
    assert sorted(event.transitions, key=repr) == sorted(expected, key=repr)


def test_the_table_has_a_row_for_every_event_kind_the_vocabulary_names() -> None:
    assert {event.kind for _, event, _ in TABLE} >= EVENT_TYPES
    assert all(any(event.kind.startswith(prefix) for _, event, _ in TABLE) for prefix in EVENT_PREFIXES)
