"""What an event of the followed stream changes in its session, said once for both lines: a call
opened or closed, the session's turn over. Listeners match on these typed transitions instead of
decoding :mod:`proxy.opencode.vocabulary`'s kinds each, so a new opencode status changes only
`transitions`.

1.18's `/global/event` opens a v2 call at `session.next.tool.called` and closes it at any of
`CALL_ENDED`, under `callID`; 2.x's `/api/event` opens one as its input starts to stream or as
it runs, and closes it at `API_CALL_ENDED`, under `id` (newer) or `callID` (`api_call_id`).
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.opencode.events_2x import api_call_id
from proxy.opencode.followed_events import FollowedEvent
from proxy.opencode.vocabulary import API_CALL_ENDED, API_CALL_OPENING, CALL_ENDED, CALL_STARTED, ends_turn

__all__ = ["CallClosed", "CallOpened", "SessionIdle", "Transition", "transitions"]


@dataclass(frozen=True, slots=True)
class CallOpened:
    """A tool call the stream showed open, where it lives, and the key the server named it under."""

    session_id: str
    call_id: str
    message_id: str
    key: str
    directory: str | None
    line_2x: bool
    """Shown by 2.x's `/api/event` (else by 1.18's `/global/event`, a v2 session's)."""


@dataclass(frozen=True, slots=True)
class CallClosed:
    session_id: str
    call_id: str
    line_2x: bool


@dataclass(frozen=True, slots=True)
class SessionIdle:
    """The session's turn is over (a status unknown here does not say so)."""

    session_id: str
    line_2x: bool


Transition = CallOpened | CallClosed | SessionIdle


def transitions(event: FollowedEvent) -> tuple[Transition, ...]:
    """What `event` changes in its session; nothing for an event of no session."""
    if (session_id := event.session_id) is None:
        return ()
    found = _call(event, session_id)
    idle = (SessionIdle(session_id, event.api),) if ends_turn(event.kind, event.properties) else ()
    return (found, *idle) if found is not None else idle


def _call(event: FollowedEvent, session_id: str) -> CallOpened | CallClosed | None:
    kind, properties = event.kind, event.properties
    if event.api and kind in (*API_CALL_OPENING, *API_CALL_ENDED):
        if (found := api_call_id(properties)) is None:
            return None
        key, call_id = found
        if kind in API_CALL_ENDED:
            return CallClosed(session_id, call_id, line_2x=True)
        message_id = str(properties.get("assistantMessageID"))
        return CallOpened(session_id, call_id, message_id, key, event.directory, line_2x=True)
    call = properties.get("callID")
    if (kind != CALL_STARTED and kind not in CALL_ENDED) or not isinstance(call, str):
        return None
    if kind in CALL_ENDED:
        return CallClosed(session_id, call, line_2x=False)
    message_id = str(properties.get("assistantMessageID"))
    return CallOpened(session_id, call, message_id, "callID", event.directory, line_2x=False)
