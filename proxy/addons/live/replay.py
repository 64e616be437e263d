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

from proxy.addons.live.memory import Place
from proxy.opencode import jsonio
from proxy.opencode.events_2x import new_api_frame
from proxy.opencode.followed_events import FollowedEvent
from proxy.opencode.vocabulary import (
    API_TOOL_FAILED,
    MESSAGE_UPDATED,
    PART_UPDATED,
    STATUS_SUBJECT,
    idle_status,
    message_subject,
    news_subjects,
    opencode_event,
    part_subject,
    settled_part_id,
)
from proxy.relay.bounded import Bounded
from rules import V1, OpenTool

REMEMBERED = 1_000
"""Sessions with a replay; the least recently told go first. A replay matters to a client that
comes back after a crash, within seconds of it: the sessions of the last few crashes are enough."""
REPLAYED_PER_SESSION = 3_000
"""Things kept per session to replay to streams that connect later; the oldest go first."""
REPLAYED_BYTES = 2 * 2**20
"""The replays' events together, as JSON (a tool part carries its output): the least recently told
sessions go first, then, if one session alone holds more, its oldest events. Without it every
settlement of a proxy's life stays (each crash's sessions, their parts and prompts: the soak's
proxy grew with every round), while what one crash leaves to replay (its sessions' open parts,
the prompts and answers of their resumes) is some tens of KB a session."""
USER_MESSAGES_PER_SESSION = 3
"""User messages kept per session after its settlement (a resume prompts at most `--resume-attempts`
times, 3 by default); later ones are not kept, so a busy session's prompts never grow the proxy."""


@dataclass(frozen=True, slots=True)
class Replayed:
    """One event to replay, and where it lives (for the stream's framing)."""

    place: OpenTool | Place
    event: dict[str, Any]
    line_2x: bool = False
    """A 2.x event, for the clients of `/api/event`."""
    size: int = 0
    """The event's bytes as JSON, counted against `REPLAYED_BYTES`."""

    @classmethod
    def of(cls, place: OpenTool | Place, event: dict[str, Any], line_2x: bool = False) -> Replayed:
        return cls(place, event, line_2x, len(jsonio.dumps(event)))


class Replays:
    """Per session, by what it is news of, the newest event a later client must be replayed;
    at most `REMEMBERED` sessions, `REPLAYED_PER_SESSION` events each, `budget` bytes in all."""

    def __init__(self, budget: int | None = None) -> None:
        self.sessions: Bounded[str, Bounded[str, Replayed]] = Bounded(REMEMBERED, forgotten=self._gone)
        self._budget = REPLAYED_BYTES if budget is None else budget
        self.size = 0
        """The kept events' bytes."""

    def keep(
        self, key: str, place: OpenTool | Place, state: list[dict[str, Any]], *, line_2x: bool = False
    ) -> None:
        """Keep what `state` says (announced under `key`), each event under what it is news of."""
        kept = self._session(place.session_id)
        for index, event in enumerate(state):
            subjects = news_subjects(
                str(event.get("type")), event.get("data" if line_2x else "properties") or {}
            )
            self._put(kept, subjects[0] if subjects else f"{key}#{index}", Replayed.of(place, event, line_2x))

    def withdraw(self, session_id: str, subject: str) -> None:
        """Replay no more what the session's replay says of `subject` (a notice withdrawn)."""
        if (kept := self.sessions.get(session_id)) is not None:
            self._pop(kept, subject)

    def _session(self, session_id: str) -> Bounded[str, Replayed]:
        kept = self.sessions.get(session_id)
        if kept is None:
            kept = self.sessions[session_id] = Bounded(REPLAYED_PER_SESSION, forgotten=self._forgotten)
        return kept

    def _put(self, kept: Bounded[str, Replayed], subject: str, replayed: Replayed) -> None:
        self._pop(kept, subject)
        kept[subject] = replayed  # past REPLAYED_PER_SESSION, the oldest is forgotten
        self.size += replayed.size
        while self.size > self._budget and len(self.sessions) > 1:  # `kept` is the most recent
            oldest = next(iter(self.sessions))
            self._gone(oldest, self.sessions.pop(oldest))
        while self.size > self._budget and len(kept) > 1:
            self._pop(kept, next(iter(kept)))

    def _pop(self, kept: Bounded[str, Replayed], subject: str) -> None:
        if (replayed := kept.pop(subject, None)) is not None:
            self.size -= replayed.size

    def _forgotten(self, _: str, replayed: Replayed) -> None:
        self.size -= replayed.size

    def _gone(self, _: str, kept: Bounded[str, Replayed]) -> None:
        self.size -= sum(replayed.size for replayed in kept.values())

    def all(self) -> list[Replayed]:
        """Each session's kept events, its messages before their parts: the server announces a
        user message again after its text (with the turn's summary), and the web UI drops a part
        of a message it does not hold, so a prompt replayed in the order kept lost its text."""
        return [replayed for kept in self.sessions.values() for replayed in _messages_first(kept.values())]

    def told_idle(self, session_id: str) -> bool:
        """Whether the session is idle in its replay (told so by the proxy, or by the server since)."""
        kept = self.sessions.get(session_id)
        return kept is not None and STATUS_SUBJECT in kept

    def heard(self, event: FollowedEvent) -> None:
        """Take what the followed stream says of a session with a replay, or of a call settled
        as interrupted (a write-back's, when the stream had not shown the call open): a client
        back after it never fetches again, so it is replayed like the proxy's own settlement."""
        session_id = event.session_id
        if session_id is None:
            return
        if (kept := self.sessions.get(session_id)) is None:
            if event.line_2x or not _settled_as_interrupted(event):
                return
            kept = self._session(session_id)
        place = Place(session_id, "", event.directory, event.project)
        if event.line_2x:
            subject, said = _heard_2x(event, place, kept)
        elif event.turn_over:
            subject, said = STATUS_SUBJECT, Replayed.of(place, idle_status(session_id))
        else:
            self._heard_1x(event, place, kept)
            return
        if subject is None:
            return
        if said is None:
            self._pop(kept, subject)
        else:
            self._put(kept, subject, said)

    def _heard_1x(self, event: FollowedEvent, place: Place, kept: Bounded[str, Replayed]) -> None:
        subjects = news_subjects(event.kind, event.properties)
        if not subjects:
            return
        if _agrees(event, kept) or _user_message(event, kept) or _settled_as_interrupted(event):
            self._put(kept, subjects[0], Replayed.of(place, opencode_event(event.kind, event.properties)))
            return
        for subject in subjects:
            self._pop(kept, subject)


def _messages_first(replays: Iterable[Replayed]) -> list[Replayed]:
    return sorted(replays, key=lambda replayed: replayed.event.get("type") != MESSAGE_UPDATED)


def _heard_2x(
    event: FollowedEvent, place: Place, kept: Bounded[str, Replayed]
) -> tuple[str | None, Replayed | None]:
    """2.x: the server's end of an execution, or its failure of a replayed call, agrees and is kept
    as the server said it; any other news of a call or of the execution ends that replay. So does
    what the server stored itself (`durable`): a copy would repeat it under a new id and no `seq`,
    while its view and log already say it to any client that reads them."""
    subjects = news_subjects(event.kind, event.properties)
    if not subjects:
        return None, None
    agrees = event.turn_over or (event.kind == API_TOOL_FAILED and subjects[0] in kept)
    if agrees and not event.durable:
        said = new_api_frame(event.kind, event.properties, int(time.time() * 1000), event.directory)
        return subjects[0], Replayed.of(place, said, True)
    return subjects[0], None


def _settled_as_interrupted(event: FollowedEvent) -> bool:
    """A tool part the server now holds settled as a crash's interruption (any write-back's)."""
    if settled_part_id(event.kind, event.properties) is None:
        return False
    state = event.properties["part"].get("state")
    return isinstance(state, dict) and V1.settled_as_interrupted(state)


def _agrees(event: FollowedEvent, kept: Bounded[str, Replayed]) -> bool:
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


def _user_message(event: FollowedEvent, kept: Bounded[str, Replayed]) -> bool:
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
