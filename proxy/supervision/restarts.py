"""When a supervised server that exited is started again, and why: supervisord's `startsecs`.

A server that answered on its port for `startsecs` has served: its exit is a crash, and it is
started again after the first, short pause however often it crashed before. Only exits in a row
of a server that had not (it never answered, or answered only briefly) wait longer each time. A
server that never answered in any start is not restarted at all: that is a failed start (a wrong
command, a port it cannot have, a configuration it refuses), which a restart only repeats.
"""

from __future__ import annotations

from dataclasses import dataclass

BACKOFF_S = (0.5, 1.0, 2.0, 4.0, 8.0, 15.0)
"""Pauses before the first, second, … restart of exits in a row; the last one repeats."""
STARTSECS_S = 10.0
"""How long a server must have answered for its exit to be a crash of a server that served."""


@dataclass(frozen=True, slots=True)
class Pause:
    """How long the next start waits (None: there is none), and why, as a person reads it."""

    seconds: float | None
    why: str

    def as_json(self) -> dict[str, object]:
        return {"after_s": self.seconds, "why": self.why}


FAILED_START = Pause(
    None, "a server that exits before it ever answered is a failed start, not a crash: not restarted"
)


@dataclass(slots=True)
class Restarts:
    """The count of exits in a row of a server that had not served, and the pause each earns."""

    backoff: tuple[float, ...] = BACKOFF_S
    startsecs: float = STARTSECS_S
    failures: int = 0
    """Exits in a row of a server that had not answered for `startsecs` (the last one included)."""
    answered_ever: bool = False
    """Whether any start of the server answered: until one does, an exit is a failed start."""

    def exited(self, answered_for: float | None) -> Pause:
        """The pause after an exit of a server that had answered for `answered_for` seconds
        (None: it never answered), counted into the exits in a row."""
        pause = self.preview(answered_for)
        if pause.seconds is not None:
            self.failures = 0 if self._served(answered_for) else self.failures + 1
        return pause

    def preview(self, answered_for: float | None) -> Pause:
        """The pause an exit now would earn, counting nothing (for `/_settle/health`)."""
        if not self.answered_ever:
            return FAILED_START
        if self._served(answered_for):
            return Pause(
                self.backoff[0],
                f"the server answered for {answered_for:.0f} s, at least {self.startsecs:g} s "
                "(startsecs): a crash of a server that served restarts after the first pause",
            )
        failures = self.failures + 1
        seconds = self.backoff[min(failures, len(self.backoff)) - 1]
        had = (
            "never answered"
            if answered_for is None
            else f"answered for only {answered_for:.1f} s (less than {self.startsecs:g} s)"
        )
        row = f"exit {failures} in a row of a server that did not serve, each waits longer"
        return Pause(seconds, f"this start {had}: {row}")

    def _served(self, answered_for: float | None) -> bool:
        return answered_for is not None and answered_for >= self.startsecs
