"""What a client stream that opens later is replayed, for the live-settle addon.

A client open across a crash (the TUI, the web UI) reconnects by itself, whenever it likes, and
never fetches again: what was said while its stream was down never reaches it. So what the addon
announces is kept per session as what it says of each thing a client holds (`news_subjects`: a
part, a message, the session's status), and only news of that same thing ends its replay. News of
the session as a whole (a resumed turn's own events, its title) says nothing of an old call: ended
by it, the replay left a client that came back after it holding the call running for good.

News of a replayed thing that agrees with it (the server's write-back of a replayed part, a
replayed message completed, the session idle again) is kept instead, as the server said it; any
other (a part open again or changed, a message written on, the session busy) withdraws it. A user
message the server announces in a session with a replay (a resume's prompt, a person's), and its
parts, are kept too, as the server said them: a client that missed them would show the turn's
answer without its question.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from proxy.addons.live_memory import REMEMBERED, Place
from proxy.opencode.events_2x import api_event
from proxy.opencode.global_events import GlobalEvent
from proxy.opencode.vocabulary import (
    API_TOOL_FAILED,
    MESSAGE_UPDATED,
    PART_UPDATED,
    STATUS_SUBJECT,
    ends_turn,
    idle_status,
    message_subject,
    news_subjects,
    opencode_event,
    part_subject,
    settled_part_id,
)
from proxy.relay.bounded import Bounded
from rules import V1, OpenTool

REPLAYED_PER_SESSION = 3_000
"""Things kept per session to replay to streams that connect later; the oldest go first."""
USER_MESSAGES_PER_SESSION = 3
"""User messages kept per session after its settlement (a resume prompts at most `--resume-attempts`
times, 3 by default); later ones are not kept, so a busy session's prompts never grow the proxy."""


@dataclass(frozen=True, slots=True)
class Replayed:
    """One event to replay, and where it lives (for the stream's framing)."""

    place: OpenTool | Place
    event: dict[str, Any]
    api: bool = False
    """A 2.x event, for the clients of `/api/event`."""


class Replays:
    """Per session, by what it is news of, the newest event a later client must be replayed."""

    def __init__(self) -> None:
        self.sessions: Bounded[str, Bounded[str, Replayed]] = Bounded(REMEMBERED)

    def keep(
        self, key: str, place: OpenTool | Place, state: list[dict[str, Any]], *, api: bool = False
    ) -> None:
        """Keep what `state` says (announced under `key`), each event under what it is news of."""
        kept = self.sessions.setdefault(place.session_id, Bounded(REPLAYED_PER_SESSION))
        for index, event in enumerate(state):
            subjects = news_subjects(str(event.get("type")), event.get("data" if api else "properties") or {})
            kept[subjects[0] if subjects else f"{key}#{index}"] = Replayed(place, event, api)

    def all(self) -> list[Replayed]:
        """Each session's kept events, its messages before their parts: the server announces a
        user message again after its text (with the turn's summary), and the web UI drops a part
        of a message it does not hold, so a prompt replayed in the order kept lost its text."""
        return [replayed for kept in self.sessions.values() for replayed in _messages_first(kept.values())]

    def told_idle(self, session_id: str) -> bool:
        """Whether the session is idle in its replay (told so by the proxy, or by the server since)."""
        kept = self.sessions.get(session_id)
        return kept is not None and STATUS_SUBJECT in kept

    def heard(self, event: GlobalEvent) -> None:
        """Take what the followed stream says of a session with a replay, or of a call settled
        as interrupted (a write-back's, when the stream had not shown the call open): a client
        back after it never fetches again, so it is replayed like the proxy's own settlement."""
        session_id = event.session_id
        if session_id is None:
            return
        if (kept := self.sessions.get(session_id)) is None:
            if event.api or not _settled_as_interrupted(event):
                return
            kept = self.sessions.setdefault(session_id, Bounded(REPLAYED_PER_SESSION))
        place = Place(session_id, "", event.directory, event.project)
        if event.api:
            _heard_2x(event, place, kept)
            return
        if ends_turn(event.kind, event.properties):
            kept[STATUS_SUBJECT] = Replayed(place, idle_status(session_id))
            return
        subjects = news_subjects(event.kind, event.properties)
        if not subjects:
            return
        if _agrees(event, kept) or _user_message(event, kept) or _settled_as_interrupted(event):
            kept[subjects[0]] = Replayed(place, opencode_event(event.kind, event.properties))
            return
        for subject in subjects:
            kept.pop(subject, None)


def _messages_first(replays: Iterable[Replayed]) -> list[Replayed]:
    return sorted(replays, key=lambda replayed: replayed.event.get("type") != MESSAGE_UPDATED)


def _heard_2x(event: GlobalEvent, place: Place, kept: Bounded[str, Replayed]) -> None:
    """2.x: the server's end of an execution, or its failure of a replayed call, agrees and is kept
    as the server said it; any other news of a call or of the execution ends that replay. So does
    what the server stored itself (`durable`): a copy would repeat it under a new id and no `seq`,
    while its view and log already say it to any client that reads them."""
    subjects = news_subjects(event.kind, event.properties)
    if not subjects:
        return
    agrees = ends_turn(event.kind, event.properties) or (
        event.kind == API_TOOL_FAILED and subjects[0] in kept
    )
    if agrees and not event.durable:
        said = api_event(event.kind, event.properties, int(time.time() * 1000), event.directory)
        kept[subjects[0]] = Replayed(place, said, True)
    else:
        kept.pop(subjects[0], None)


def _settled_as_interrupted(event: GlobalEvent) -> bool:
    """A tool part the server now holds settled as a crash's interruption (any write-back's)."""
    if settled_part_id(event.kind, event.properties) is None:
        return False
    state = event.properties["part"].get("state")
    return isinstance(state, dict) and V1.settled_as_interrupted(state)


def _agrees(event: GlobalEvent, kept: Bounded[str, Replayed]) -> bool:
    """A replayed part the server shows settled, or a replayed message it shows completed."""
    if (part_id := settled_part_id(event.kind, event.properties)) is not None:
        return part_subject(part_id) in kept
    info = event.properties.get("info")
    return (
        event.kind == MESSAGE_UPDATED
        and isinstance(info, dict)
        and message_subject(info.get("id")) in kept
        and "completed" in (info.get("time") or {})
        and info.get("role") == "assistant"
    )


def _user_message(event: GlobalEvent, kept: Bounded[str, Replayed]) -> bool:
    """A user message (one of the first few), or a part of one kept, as the server announces it."""
    users = {subject for subject, replayed in kept.items() if _role(replayed.event) == "user"}
    if event.kind == MESSAGE_UPDATED:
        subject = message_subject((event.properties.get("info") or {}).get("id"))
        said = {"type": event.kind, "properties": event.properties}
        return _role(said) == "user" and (subject in users or len(users) < USER_MESSAGES_PER_SESSION)
    part = event.properties.get("part")
    return (
        event.kind == PART_UPDATED
        and isinstance(part, dict)
        and message_subject(part.get("messageID")) in users
    )


def _role(event: dict[str, Any]) -> object:
    info = (event.get("properties") or {}).get("info")
    return info.get("role") if event.get("type") == MESSAGE_UPDATED and isinstance(info, dict) else None
