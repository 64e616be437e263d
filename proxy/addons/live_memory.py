"""What the followed event stream last showed open, for the live-settle addon.

Kept from `/global/event` (bounded, the oldest forgotten first) so that when the stream
comes back after a loss, or a session goes idle with a part still open, the addon knows
what a client may still show running: v1 tool parts, busy sessions, unfinished assistant
messages.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.addons.live_watch import says_idle
from proxy.opencode.tracker import GlobalEvent
from proxy.opencode.vocabulary import MESSAGE_UPDATED, PART_UPDATED, SESSION_STATUS, is_open_tool
from proxy.relay.bounded import Bounded
from rules import V1, OpenTool

REMEMBERED = 10_000


@dataclass(frozen=True, slots=True)
class Place:
    """A busy session or an unfinished assistant message the stream showed, and where it lives
    (an open tool part is a `rules.OpenTool`)."""

    session_id: str
    message_id: str
    directory: str | None
    project: str | None


class StreamMemory:
    """Open parts, busy sessions and unfinished messages, as the stream last showed them."""

    def __init__(self) -> None:
        self.parts: Bounded[str, OpenTool] = Bounded(REMEMBERED)
        """Open v1 tool parts, by part id."""
        self.busy: Bounded[str, Place] = Bounded(REMEMBERED)
        """Sessions the stream last showed busy (`message_id` empty), by session id."""
        self.unfinished: Bounded[str, Place] = Bounded(REMEMBERED)
        """Assistant messages the stream last showed without `time.completed`, by message id."""

    def observe(self, event: GlobalEvent) -> str | None:
        """Remember what `event` shows; return the session it says went idle while one of its
        parts is open (its parts must be confirmed), else None."""
        if event.kind == PART_UPDATED:
            self._part_updated(event)
        elif event.kind == MESSAGE_UPDATED:
            self._message_updated(event)
        elif event.session_id is not None and says_idle(event):
            self.busy.pop(event.session_id, None)
            return event.session_id if self.has_open(event.session_id) else None
        elif event.session_id is not None and event.kind == SESSION_STATUS:
            self.busy[event.session_id] = Place(event.session_id, "", event.directory, event.project)
        return None

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

    def _part_updated(self, event: GlobalEvent) -> None:
        part = event.properties.get("part")
        if not isinstance(part, dict) or not isinstance(part.get("id"), str):
            return
        if is_open_tool(part, V1.api):
            tool = part.get("tool")
            place = OpenTool(
                V1.api,
                str(part.get("sessionID")),
                str(part.get("messageID")),
                part["id"],
                tool if isinstance(tool, str) else None,
                directory=event.directory,
                project=event.project,
            )
            self.parts[part["id"]] = place
        else:
            self.parts.pop(part["id"], None)

    def _message_updated(self, event: GlobalEvent) -> None:
        info = event.properties.get("info")
        if (
            not isinstance(info, dict)
            or info.get("role") != "assistant"
            or not isinstance(info.get("id"), str)
        ):
            return
        if "completed" in (info.get("time") or {}):
            self.unfinished.pop(info["id"], None)
        else:
            place = Place(str(info.get("sessionID")), info["id"], event.directory, event.project)
            self.unfinished[info["id"]] = place
