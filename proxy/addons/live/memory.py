"""What the followed event stream last showed open, for the live-settle addon.

Kept from `/global/event` (bounded, the oldest forgotten first) so that when the stream
comes back after a loss, or a session goes idle with a part still open, the addon knows
what a client may still show running: v1 tool parts, busy sessions, unfinished assistant
messages. Each change can also be handed to a `Keeper` (`kept`: the state database, for the
proxy that runs next on the same address).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol, TypeVar

from proxy.opencode.sessions import (
    MessageCompleted,
    MessageUnfinished,
    PartNotOpen,
    PartOpen,
    SessionIdle,
    StatusShown,
)
from proxy.opencode.tracker import FollowedEvent
from proxy.relay.bounded import Bounded
from rules import OpenTool

REMEMBERED = 10_000
Kind = Literal["part", "session", "message", "call"]
"""An open part, a session shown busy, an assistant message shown unfinished, an open 2.x call."""


@dataclass(frozen=True, slots=True)
class Place:
    """A busy session or an unfinished assistant message the stream showed, and where it lives
    (an open tool part is a `rules.OpenTool`)."""

    session_id: str
    message_id: str
    directory: str | None
    project: str | None


@dataclass(frozen=True, slots=True)
class OpenCall:
    """A call 2.x's `/api/event` showed open: where it lives, and the key the server named it under
    (`id`, or `callID` on earlier builds)."""

    session_id: str
    message_id: str
    call_id: str
    key: str
    directory: str | None


Remembered = OpenTool | Place | OpenCall
"""Anything the memory holds open."""
V = TypeVar("V", bound=Remembered)


class Keeper(Protocol):
    """Where the memory's changes are kept beyond this process."""

    def keep(self, kind: Kind, key: str, place: Remembered) -> None: ...

    def drop(self, kind: Kind, key: str) -> None: ...


class _KindMemory(Bounded[str, V]):
    """One kind of the memory: each entry set anew, deleted or forgotten is told to the keeper."""

    def __init__(self, kind: Kind) -> None:
        super().__init__(REMEMBERED)
        self._kind: Kind = kind
        self._keeper: Keeper | None = None

    def kept_by(self, keeper: Keeper) -> None:
        self._keeper = keeper
        self._forgotten = lambda key, _: keeper.drop(self._kind, key)

    def restore(self, key: str, value: V) -> None:
        """Set what the keeper already holds (loaded from it), without telling it again."""
        super().__setitem__(key, value)

    def __setitem__(self, key: str, value: V) -> None:
        keeper = self._keeper
        changed = keeper is not None and self.peek(key) != value
        super().__setitem__(key, value)
        if changed and keeper is not None:
            keeper.keep(self._kind, key, value)

    def __delitem__(self, key: str) -> None:
        super().__delitem__(key)
        if self._keeper is not None:
            self._keeper.drop(self._kind, key)


class StreamMemory:
    """Open parts, busy sessions, unfinished messages and open 2.x calls, as the stream last
    showed them."""

    def __init__(self) -> None:
        self.parts: _KindMemory[OpenTool] = _KindMemory("part")
        """Open v1 tool parts, by part id."""
        self.busy: _KindMemory[Place] = _KindMemory("session")
        """Sessions the stream last showed busy (`message_id` empty), by session id."""
        self.unfinished: _KindMemory[Place] = _KindMemory("message")
        """Assistant messages the stream last showed without `time.completed`, by message id."""
        self.calls: _KindMemory[OpenCall] = _KindMemory("call")
        """Calls 2.x's `/api/event` showed open (`calls` reads and changes them), by call id."""

    def kept_by(self, keeper: Keeper) -> None:
        """Hand every change from now on to `keeper` too."""
        for kept in (self.parts, self.busy, self.unfinished, self.calls):
            kept.kept_by(keeper)

    def restore(self, kind: Kind, key: str, place: Remembered) -> None:
        """Hold what the keeper kept of a proxy before (not told to it again)."""
        if isinstance(place, OpenTool):
            self.parts.restore(key, place)
        elif isinstance(place, OpenCall):
            self.calls.restore(key, place)
        else:
            (self.busy if kind == "session" else self.unfinished).restore(key, place)

    def observe(self, event: FollowedEvent) -> str | None:
        """Remember what `event` shows; return the session it says went idle while one of its
        parts is open (its parts must be confirmed), else None."""
        idle = None
        for change in event.transitions:
            match change:
                case PartOpen(tool):
                    self.parts[tool.part] = tool
                case PartNotOpen(part_id):
                    self.parts.pop(part_id, None)
                case MessageUnfinished(session_id, message_id, directory, project):
                    self.unfinished[message_id] = Place(session_id, message_id, directory, project)
                case MessageCompleted(message_id):
                    self.unfinished.pop(message_id, None)
                case SessionIdle(session_id):
                    self.busy.pop(session_id, None)
                    idle = session_id if self.has_open(session_id) else None
                case StatusShown(session_id, active, directory, project) if active is not False:
                    self.busy[session_id] = Place(session_id, "", directory, project)
        return idle

    def has_open(self, session_id: str) -> bool:
        return any(part.session_id == session_id for part in self.parts.values())

    def open_parts(self, session_id: str) -> list[OpenTool]:
        return [part for part in self.parts.values() if part.session_id == session_id]

    def unfinished_messages(self, session_id: str) -> list[tuple[str, Place]]:
        return [(mid, m) for mid, m in self.unfinished.items() if m.session_id == session_id]

    def sessions_with_parts(self) -> set[str]:
        return {part.session_id for part in self.parts.values()}

    def sessions_with_turns(self) -> set[str]:
        """Sessions shown busy or with an unfinished message."""
        return {m.session_id for m in self.unfinished.values()} | set(self.busy)
