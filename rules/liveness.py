"""What the server says about a session's liveness, as the rules see it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

FRESH_MARGIN_MS = 2_000
"""How long after a tool's last sign of life a reading must be taken to vouch that it is dead.

A turn announces itself before any of its tools can run, but an announcement can still be in
flight while a fresh tool is read; a reading taken this long after the tool cannot have missed it.
"""


class Doubt(StrEnum):
    """Why a reading cannot call something orphaned: each way it could still be alive."""

    ACTIVE = "the session is active"
    TOO_RECENT = "it was alive too shortly before the reading"
    ELSEWHERE = "another process on the server's database may be running it"


@dataclass(frozen=True, slots=True)
class Liveness:
    """A liveness reading for one session.

    `active` must come from a reading taken *after* the message was produced: a turn that
    started in between is then seen as active, never mistaken for a crash.
    """

    session_id: str
    active: bool
    taken_at: int | None = None
    """When the reading was taken, in the server's clock (epoch ms). A tool last alive less than
    `FRESH_MARGIN_MS` before it is left alone. None: the caller vouches that the reading is
    later than anything the message records (a library user with a fresh answer in hand)."""
    elsewhere_since: int | None = None
    """The start (epoch ms) of the earliest other live process that shares the server's database.
    Liveness is per process, so a tool alive at or after that moment may be running there, and is
    left alone. None: no such process is known."""

    def vouches_for(self, last_alive: int) -> bool:
        """Whether this reading may call a tool (or message) last alive at `last_alive` orphaned."""
        return self.doubt(last_alive) is None

    def doubt(self, last_alive: int) -> Doubt | None:
        """Why this reading cannot call what was last alive at `last_alive` orphaned (None: it can)."""
        if self.active:
            return Doubt.ACTIVE
        if self.taken_at is not None and last_alive + FRESH_MARGIN_MS > self.taken_at:
            return Doubt.TOO_RECENT
        if self.elsewhere_since is not None and last_alive >= self.elsewhere_since:
            return Doubt.ELSEWHERE
        return None
