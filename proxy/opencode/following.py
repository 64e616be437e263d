"""What following an event stream reports: its state, what it counts, and who else listens."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol, runtime_checkable

from prometheus_client import CollectorRegistry, Counter

from proxy.opencode.followed_events import FollowedEvent

__all__ = ["StreamListener", "StreamMetrics", "StreamState"]


class StreamState(StrEnum):
    CONNECTING = "connecting"
    FOLLOWING = "following"
    REFUSED = "refused"
    """The upstream refused the subscription (HTTP error, e.g. 401 without credentials)."""
    FAILED = "failed"
    """Following failed in the proxy itself; it starts again in a moment."""
    NOT_FOLLOWED = "not followed"
    """The server is of a line (or a version) whose stream this proxy does not read."""


@dataclass(frozen=True, slots=True)
class StreamMetrics:
    """What the tracker counts: events skipped as unreadable (by reason), listeners that
    raised (by listener and hook), and restarts of following after it failed."""

    unreadable_events: Counter
    listener_errors: Counter
    restarts: Counter

    @classmethod
    def unregistered(cls) -> StreamMetrics:
        """Counters nobody serves, for a tracker built without an application."""
        registry = CollectorRegistry()
        return cls(
            Counter("unreadable_events", "", ("reason",), registry=registry),
            Counter("listener_errors", "", ("listener", "hook"), registry=registry),
            Counter("restarts", "", registry=registry),
        )


@runtime_checkable
class StreamListener(Protocol):
    """Something else that wants the stream's events (after the tracker has applied them). A
    subclass implements only the hooks it needs: the tracker calls a listener only for those (as
    `relay.hooks.Addons` calls an addon's), so one that only wants to know the stream is back
    defines `following` alone."""

    def following(self) -> None:
        """The stream has (re)connected: whatever happened while it was down was not seen."""
        return None

    def event(self, event: FollowedEvent) -> None:
        """One event, in stream order."""
        return None
