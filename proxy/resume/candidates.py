"""Which sessions were running when the server went away: kept from the followed event stream.

Only a turn the proxy saw running can be one a crash interrupted: a stale session found in a
view later may be an old crash from before the proxy was watching. So `BusySessions` keeps the
sessions the stream last showed busy (`TurnRunning` until `TurnStopped`, decoded once in
:mod:`proxy.opencode.sessions`: v1 `session.status` busy or retrying, or a tool part shown
running, until idle; v2 any `session.next.*` event until a step ends with a finish other than
`tool-calls`; 2.x any `session.*` event of `/api/event` until its execution ends, a `shutdown`
aside, which is the server going away mid-turn), and the permissions and questions asked and
not yet answered (a person must answer those). When the stream comes back after a loss, each
session still busy is handed on as a `Candidate`, with the moment the stream last spoke as its
last sign of life.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from proxy.opencode.dialects import LINE_1_18, LINE_2X, Dialect
from proxy.opencode.sessions import MessageMentioned, PersonAnswered, PersonAsked, TurnRunning, TurnStopped
from proxy.opencode.tracker import FollowedEvent, StreamListener
from proxy.relay.bounded import Bounded
from rules import Api

__all__ = ["BusySessions", "Candidate"]

REMEMBERED = 10_000
"""Sessions kept busy, asking a person, or with a newest message, each the least recently heard
of forgotten first: far more than one server runs at once. A session forgotten busy is not
resumed (the safe way); one forgotten asking is still asked of the server before a resume."""
ASKED_PER_SESSION = 64
"""Requests kept per session that a person has not answered: a turn waits on what it asked,
so a session has a few at a time (one per call running in parallel); only whether any is
left, and the first one's kind, is read."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """A session the stream showed busy when it was lost."""

    session_id: str
    api: Api
    directory: str | None
    last_alive: float
    """`time.monotonic()` when the stream last spoke before it was lost."""
    waiting_on_person: str | None
    dialect: Dialect = LINE_1_18
    """The line whose stream showed it (2.x's `/api/event`, else 1.18's): how it is resumed."""
    seen_message: str | None = None
    """The newest message of the session the stream spoke of before it was lost: a message newer
    than it was made after the crash (a person's turn, or another proxy's resume), and a turn the
    crash cut off is never newer (ids ascend with creation)."""


class BusySessions(StreamListener):
    """A `StreamListener`; `start(candidate)` is called for each session busy at a loss."""

    def __init__(
        self, start: Callable[[Candidate], None], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._start = start
        self._clock = clock
        self._busy: Bounded[str, tuple[Api, str | None, Dialect]] = Bounded(REMEMBERED)
        self._asked: Bounded[str, Bounded[str, str]] = Bounded(REMEMBERED)
        """Per session, the permission and question requests not yet answered, by id: their kind."""
        self._seen: Bounded[str, str] = Bounded(REMEMBERED)
        """Per session, the newest message its events spoke of."""
        self._heard: float | None = None

    def running(self) -> list[str]:
        """The sessions the stream shows in a turn now (what a crash now would hand on)."""
        return list(self._busy)

    def following(self) -> None:
        busy, asked, heard = self._busy, self._asked, self._heard
        self._busy, self._asked = Bounded(REMEMBERED), Bounded(REMEMBERED)
        if heard is None:
            return
        for session_id, (api, directory, dialect) in busy.items():
            waiting = asked.get(session_id)
            person = f"a {next(iter(waiting.values()))} asked" if waiting else None
            seen = self._seen.get(session_id)
            self._start(Candidate(session_id, api, directory, heard, person, dialect, seen))

    def event(self, event: FollowedEvent) -> None:
        self._heard = self._clock()
        for change in event.transitions:
            match change:
                case MessageMentioned(session_id, message_id):
                    if message_id > self._seen.get(session_id, ""):
                        self._seen[session_id] = message_id
                case TurnRunning(session_id, api, directory, line_2x):
                    self._busy[session_id] = (api, directory, LINE_2X if line_2x else LINE_1_18)
                case TurnStopped(session_id):
                    self._busy.pop(session_id, None)
                case PersonAsked(session_id, request, subject):
                    self._asked.setdefault(session_id, Bounded(ASKED_PER_SESSION))[request] = subject
                case PersonAnswered(session_id, request) if (
                    asked := self._asked.get(session_id)
                ) is not None:
                    asked.pop(request, None)
                    if not asked:  # nothing left to wait on: the session is no longer kept for it
                        del self._asked[session_id]
