"""What the server says about a session's liveness, as the rules see it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Liveness:
    """A liveness reading for one session.

    `active` must come from a reading taken *after* the message body was produced: a turn
    that started in between is then seen as active, never mistaken for a crash.
    """

    session_id: str
    active: bool
