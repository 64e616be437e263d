"""What a change touches and what is left open, named the way a person looks them up.

Callers read these fields; none of them needs to know where in a message's JSON the thing
lives (that stays with the change that patches it, see :mod:`rules.changes`).
"""

from __future__ import annotations

from dataclasses import dataclass

from rules.models import Api


@dataclass(frozen=True, slots=True)
class Target:
    """The message a change applies to and, for a change to one of its tool items, that item."""

    message: str
    """The message's id."""
    part: str | None = None
    """The item's id: a v1 part id, a v2 call id; None for a change to the message itself."""
    call: str | None = None
    """The tool call's id (a v1 part's `callID`, a v2 item's `id`), when the item names one."""
    tool: str | None = None
    """The tool's name, when the item names one."""

    @property
    def key(self) -> str:
        """What a write-back is told to settle: the part or call, else the message."""
        return self.part or self.message


@dataclass(frozen=True, slots=True)
class OpenTool:
    """A tool call that a view, a stream or storage still records as open, and where it lives."""

    api: Api
    session_id: str
    message_id: str
    part: str
    """The part (v1) or call (v2) id."""
    tool: str | None = None
    since: int | None = None
    """Its last known sign of life (epoch ms), when known."""
    directory: str | None = None
    project: str | None = None
