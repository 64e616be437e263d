"""What an event of the followed stream changes in its session, said once for both lines as typed
transitions: a call opened or closed, a v1 part or an assistant message shown open or finished, a
session's stated liveness, its turn running or over, a person asked or answered, a message
mentioned. Listeners match on these instead of decoding :mod:`proxy.opencode.vocabulary`'s kinds
each, so a new opencode status changes only this module. They are decoded once per event, when
the follower first asks (`FollowedEvent.transitions`), and every listener is handed the same.

Each listener keeps its own sense of "busy", so each has its own transition rather than one
sense bent to fit all: the kept readings take what an event *states* (`SessionEvent`); the live
memory a v1 `session.status` that is not idle (`StatusShown`); the resume a turn as it counts one
(`TurnRunning`, `TurnStopped`); and a turn is over for a confirmation at `SessionIdle`.

1.18's `/global/event` opens a v2 call at `session.next.tool.called` and closes it at any of
`CALL_ENDED`, under `callID`; 2.x's `/api/event` opens one as its input starts to stream or as
it runs, and closes it at `API_CALL_ENDED`, under `id` (newer) or `callID` (`api_call_id`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from proxy.opencode.events_2x import api_call_id, api_stated_liveness
from proxy.opencode.vocabulary import (
    ANSWERED,
    API_CALL_ENDED,
    API_CALL_OPENING,
    API_EXECUTION_ENDED,
    API_SESSION_PREFIX,
    API_SHUTDOWN,
    CALL_ENDED,
    CALL_STARTED,
    MESSAGE_UPDATED,
    PART_UPDATED,
    PERSON_PREFIXES,
    SESSION_ERROR,
    SESSION_IDLE,
    SESSION_STATUS,
    STEP_CALLS_TOOLS,
    STEP_ENDED,
    V2_PREFIX,
    ends_turn,
    is_open_tool,
    mentioned_message,
    stated_liveness,
    v1_status_active,
)
from rules import Api, OpenTool

__all__ = [
    "CallClosed",
    "CallOpened",
    "MessageCompleted",
    "MessageMentioned",
    "MessageUnfinished",
    "PartNotOpen",
    "PartOpen",
    "PersonAnswered",
    "PersonAsked",
    "SessionEvent",
    "SessionIdle",
    "Shown",
    "StatusShown",
    "Transition",
    "TurnRunning",
    "TurnStopped",
    "transitions",
]


class Shown(Protocol):
    """What transitions read of an event (a `FollowedEvent` is one): its kind and properties, the
    stream that showed it (`line_2x`: 2.x's `/api/event`, else 1.18's `/global/event`), and where."""

    @property
    def kind(self) -> str: ...

    @property
    def properties(self) -> dict[str, Any]: ...

    @property
    def line_2x(self) -> bool: ...

    @property
    def directory(self) -> str | None: ...

    @property
    def project(self) -> str | None: ...

    @property
    def session_id(self) -> str | None: ...


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


@dataclass(frozen=True, slots=True)
class SessionEvent:
    """What an event says about one session's liveness: what the kept readings take."""

    session_id: str
    api: Api
    busy: bool | None
    """True/False when the event states it (v1 status); None when it only says "something happened"."""


@dataclass(frozen=True, slots=True)
class StatusShown:
    """A v1 `session.status`, and whether it says a turn runs (None: a status unknown here)."""

    session_id: str
    active: bool | None
    directory: str | None
    project: str | None


@dataclass(frozen=True, slots=True)
class PartOpen:
    """A v1 tool part shown in an open status, and where it lives."""

    tool: OpenTool


@dataclass(frozen=True, slots=True)
class PartNotOpen:
    """A v1 part shown in any other state (settled, or no tool at all): nothing under its id is open."""

    part_id: str


@dataclass(frozen=True, slots=True)
class MessageUnfinished:
    """An assistant message shown without `time.completed`, and where it lives."""

    session_id: str
    message_id: str
    directory: str | None
    project: str | None


@dataclass(frozen=True, slots=True)
class MessageCompleted:
    message_id: str


@dataclass(frozen=True, slots=True)
class TurnRunning:
    """The session shown in a turn, as a resume counts one: v1 `session.status` busy or retrying, or
    a v1 tool part open; v2 any `session.next.*` event but a step that ends the turn; 2.x any
    `session.*` event but an execution's end (one for `shutdown`, the server going away mid-turn,
    is running still)."""

    session_id: str
    api: Api
    directory: str | None
    line_2x: bool


@dataclass(frozen=True, slots=True)
class TurnStopped:
    """The session shown out of a turn, as a resume counts one: v1 a status that is not busy or
    retrying (one unknown here too), `session.idle` or `session.error`; v2 a step ended with a
    finish other than `tool-calls`; 2.x an execution ended for any reason but `shutdown`."""

    session_id: str


@dataclass(frozen=True, slots=True)
class PersonAsked:
    """A permission or question a person must answer: its request id, and which of the two it is."""

    session_id: str
    request: str
    subject: str


@dataclass(frozen=True, slots=True)
class PersonAnswered:
    session_id: str
    request: str


@dataclass(frozen=True, slots=True)
class MessageMentioned:
    """A message of the session the event speaks of (ids ascend with creation)."""

    session_id: str
    message_id: str


Transition = (
    CallOpened
    | CallClosed
    | SessionIdle
    | SessionEvent
    | StatusShown
    | PartOpen
    | PartNotOpen
    | MessageUnfinished
    | MessageCompleted
    | TurnRunning
    | TurnStopped
    | PersonAsked
    | PersonAnswered
    | MessageMentioned
)


def transitions(event: Shown) -> tuple[Transition, ...]:
    """What `event` changes: a part or a message it shows (of any event, as the memory reads them),
    and what it changes in its session (nothing for an event of no session)."""
    shown = (*_part(event), *_message(event))
    if (session_id := event.session_id) is None:
        return shown
    kind, properties = event.kind, event.properties
    found: list[Transition | None] = [_call(event, session_id), _stated(event, session_id)]
    found.append(_turn(event, session_id))
    if ends_turn(kind, properties):
        found.append(SessionIdle(session_id, event.line_2x))
    if kind == SESSION_STATUS:
        active = v1_status_active(properties.get("status"))
        found.append(StatusShown(session_id, active, event.directory, event.project))
    if kind.startswith(PERSON_PREFIXES):
        found.append(_person(kind, properties, session_id))
    if (message_id := mentioned_message(kind, properties)) is not None:
        found.append(MessageMentioned(session_id, message_id))
    return (*shown, *(change for change in found if change is not None))


def _call(event: Shown, session_id: str) -> CallOpened | CallClosed | None:
    kind, properties = event.kind, event.properties
    if event.line_2x and kind in (*API_CALL_OPENING, *API_CALL_ENDED):
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


def _stated(event: Shown, session_id: str) -> SessionEvent | None:
    stated = (api_stated_liveness if event.line_2x else stated_liveness)(event.kind, event.properties)
    return None if stated is None else SessionEvent(session_id, *stated)


def _turn(event: Shown, session_id: str) -> TurnRunning | TurnStopped | None:
    """Whether the session is in a turn as a resume counts one, if the event says either."""
    if (found := _in_turn(event)) is None:
        return None
    api, running = found
    if not running:
        return TurnStopped(session_id)
    line_2x = event.line_2x and event.kind.startswith(API_SESSION_PREFIX)
    return TurnRunning(session_id, api, event.directory, line_2x)


def _in_turn(event: Shown) -> tuple[Api, bool] | None:
    """The message API the event shows its session in, and whether in a turn; None if it says neither."""
    kind, properties = event.kind, event.properties
    if event.line_2x and kind.startswith(API_SESSION_PREFIX):
        return Api.V2, kind not in API_EXECUTION_ENDED or properties.get("reason") == API_SHUTDOWN
    if kind == SESSION_STATUS:
        return Api.V1, bool(v1_status_active(properties.get("status")))
    if kind in (SESSION_IDLE, SESSION_ERROR):
        return Api.V1, False
    if kind == PART_UPDATED and is_open_tool(properties.get("part"), Api.V1):
        return Api.V1, True
    if kind.startswith(V2_PREFIX):
        return Api.V2, kind != STEP_ENDED or properties.get("finish") == STEP_CALLS_TOOLS
    return None


def _person(kind: str, properties: Mapping[str, Any], session_id: str) -> PersonAsked | PersonAnswered:
    """1.18's `permission.asked`, 2.x's `permission.v2.replied`: the subject first, the verb last."""
    subject, verb = kind.partition(".")[0], kind.rpartition(".")[2]
    request = str(properties.get("id") or properties.get("requestID") or properties.get("callID"))
    if verb in ANSWERED:
        return PersonAnswered(session_id, request)
    return PersonAsked(session_id, request, subject)


def _part(event: Shown) -> tuple[PartOpen | PartNotOpen, ...]:
    """A v1 `message.part.updated`: its part open as a tool, or not (whatever its event's session)."""
    part = event.properties.get("part")
    if event.kind != PART_UPDATED or not isinstance(part, dict) or not isinstance(part.get("id"), str):
        return ()
    if not is_open_tool(part, Api.V1):
        return (PartNotOpen(part["id"]),)
    tool = part.get("tool")
    session_id, message_id = str(part.get("sessionID")), str(part.get("messageID"))
    name = tool if isinstance(tool, str) else None
    place = OpenTool(
        Api.V1, session_id, message_id, part["id"], name, directory=event.directory, project=event.project
    )
    return (PartOpen(place),)


def _message(event: Shown) -> tuple[MessageUnfinished | MessageCompleted, ...]:
    """A `message.updated` of an assistant message: finished, or not (whatever its event's session)."""
    info = event.properties.get("info")
    if event.kind != MESSAGE_UPDATED or not isinstance(info, dict):
        return ()
    if info.get("role") != "assistant" or not isinstance(info.get("id"), str):
        return ()
    time = info.get("time") or {}
    if isinstance(time, int | float):  # no container: it says nothing, and must not stop the follower
        return ()
    if "completed" in time:
        return (MessageCompleted(info["id"]),)
    where = (event.directory, event.project)
    return (MessageUnfinished(str(info.get("sessionID")), info["id"], *where),)
