"""The readings the followed stream still vouches for, and the views seen clean since, as the tracker
keeps them: a part of their own, apart from following the stream and telling its listeners, so
that what is kept, and what drops it, is read in one place.

A reading (an on-demand answer, or what an event states: `SessionEvent`) is kept for a session
until an event about that session arrives; a stated one replaces it, any other event about the
session drops it. Whether anything kept may be believed at all (the stream is being followed) is
the tracker's to say: it asks here only while it is.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.opencode.server_clock import ServerClock
from proxy.opencode.sessions import SessionEvent
from proxy.relay.bounded import Bounded
from rules import Api, Liveness

__all__ = ["CLEAN_SESSIONS", "CLEAN_VIEWS", "KEPT_SESSIONS", "KeptReading", "KeptReadings"]

KEPT_SESSIONS = 10_000
CLEAN_SESSIONS = 1_000
CLEAN_VIEWS = 32
"""How many views (path and query) of one session are remembered clean, for how many sessions:
a client that busts caches with a new query string each time gets a scan each time, and
nothing more is kept."""


@dataclass(frozen=True, slots=True)
class KeptReading:
    """A reading the stream still vouches for. Its `taken_at` is in the server's clock: the
    `Date` of an asked reading, or for a status event the time it arrived, by the offset the
    stream's (or the latest liveness answer's) `Date` measured."""

    liveness: Liveness


class KeptReadings:
    """Readings per session and message API, and per session the views last seen without an open
    tool; each bounded, the least recently kept forgotten first. A stated reading is timed by
    `clock`."""

    def __init__(self, clock: ServerClock) -> None:
        self._clock = clock
        self._readings: Bounded[tuple[Api, str], KeptReading] = Bounded(KEPT_SESSIONS)
        self._clean: Bounded[str, Bounded[str, None]] = Bounded(CLEAN_SESSIONS)
        """Per session, the views (path and query) last seen without an open tool."""

    def cached(self, api: Api, session_id: str) -> KeptReading | None:
        return self._readings.get((api, session_id))

    def store(self, api: Api, liveness: Liveness) -> None:
        """Keep an on-demand reading, valid until the next event about its session."""
        self._readings[(api, liveness.session_id)] = KeptReading(liveness)

    def mark_clean(self, session_id: str, view: str) -> None:
        self._clean.setdefault(session_id, Bounded(CLEAN_VIEWS))[view] = None

    def known_clean(self, session_id: str, view: str) -> bool:
        return view in self._clean.get(session_id, ())

    def apply(self, event: SessionEvent) -> None:
        """What an event states replaces the session's reading; an event that only says something
        happened drops it."""
        key = (event.api, event.session_id)
        if event.busy is None:
            self._readings.pop(key, None)
        else:
            self._readings[key] = KeptReading(Liveness(event.session_id, event.busy, self._clock.now()))

    def heard(self, session_id: str) -> None:
        """An event about the session: no view of it is known clean any more."""
        self._clean.pop(session_id, None)

    def clear(self) -> None:
        """Nothing kept holds: the stream was lost or starts anew, or an event that may have been
        about any session could not be read."""
        self._readings.clear()
        self._clean.clear()
