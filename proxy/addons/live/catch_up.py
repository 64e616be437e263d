"""What a client stream that comes back missed between the proxy's reading and its own.

A stream that opens after a crash is replayed what the followed stream had said by then. The
server may have said more before it took the client's stream (so the client's own stream never
carries it) that the followed stream was not yet read up to: a resume's prompt, the session busy
again. opencode's event ids ascend with creation in one server, and a stream's first event
(`server.connected`) is made when the server takes it, so an event the followed stream reads
after the replay with a smaller id than that one was missed: it is sent to the client as the
server said it. The first with a larger id (or none) ends the catch-up: the client's own stream
carries it and all after.
"""

from __future__ import annotations

import asyncio
from collections import deque

from proxy.opencode import jsonio
from proxy.opencode.followed_events import FollowedEvent
from proxy.opencode.vocabulary import SERVER_CONNECTED

HEARD_BEFORE_OPENED = 1_000
"""Events kept while the client's first event has not passed yet; the oldest go first."""
NAMED = 10
"""Events named in the log line of a catch-up (the count is always given)."""


class CatchUp:
    """One client stream's catch-up: what the followed stream read that the client's missed."""

    def __init__(self, route: str) -> None:
        self.route = route
        self.connected: str | None = None
        """The id of the client stream's `server.connected`; None until it passed."""
        self.over = asyncio.Event()
        """Set once an event read from the followed stream was one the client's stream carries."""
        self.told: list[str] = []
        """What the client was sent that it missed (the first few, for the log), and how many."""
        self.told_count = 0
        self._heard: deque[FollowedEvent] = deque(maxlen=HEARD_BEFORE_OPENED)

    def opened(self, first: bytes) -> list[FollowedEvent]:
        """The client stream's first event(s) passed: what it missed of what was read meanwhile."""
        heard, self._heard = list(self._heard), deque()
        self.connected = connected_id(first)
        if self.connected is None:
            self.over.set()
            return []
        return self._missed(heard)

    def hear(self, event: FollowedEvent) -> list[FollowedEvent]:
        """`event` was read from the followed stream: the client missed it (then it is returned),
        or it ends the catch-up, or it waits for the client's first event."""
        if self.connected is None:
            self._heard.append(event)
            return []
        return self._missed([event])

    def sent(self, events: list[FollowedEvent]) -> None:
        """`events` were sent to the client (for the log: the first few named, all counted)."""
        self.told += [f"{event.kind} of {event.session_id}" for event in events][: NAMED - len(self.told)]
        self.told_count += len(events)

    def _missed(self, events: list[FollowedEvent]) -> list[FollowedEvent]:
        missed = []
        for event in events:
            if event.id is None or self.connected is None or event.id >= self.connected:
                self.over.set()
                break
            missed.append(event)
        return missed


def connected_id(first: bytes) -> str | None:
    """The id of the `server.connected` event that opens `first` (plain or in a `/global/event`
    envelope); None if it does not open with one."""
    for line in first.splitlines():
        if not line.startswith(b"data:"):
            continue
        try:
            envelope = jsonio.loads(line.removeprefix(b"data:"))
        except Exception:  # any unreadable first event only ends the catch-up
            return None
        payload = envelope.get("payload", envelope) if isinstance(envelope, dict) else None
        if not isinstance(payload, dict) or payload.get("type") != SERVER_CONNECTED:
            return None
        event_id = payload.get("id")
        return event_id if isinstance(event_id, str) else None
    return None
