"""The client event streams open through the proxy, for the live-settle addon.

Each client stream (`/global/event`, or `/event` of one directory) gets a queue the relay
slips events from; what the addon announces goes to every open stream now and, as state,
to streams that open later, until the stream says something newer about the session. The
server's own write-back of a part the replay shows settled is not newer: it says the same, and
a client that reconnects after it (the TUI never fetches again) still needs the replay.

A plain `/event` (no directory asked) is the stream of the server's default directory
(`live_default`). One that opens while that directory is not known waits, told nothing, and
is caught up (as a stream opening then) as soon as it is learned.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from aiohttp import web
from prometheus_client import Counter

from proxy.addons.events import event_frame
from proxy.addons.live_memory import REMEMBERED, Place
from proxy.addons.routing import route_of
from proxy.opencode.global_events import GlobalEvent
from proxy.opencode.routes import EventStream
from proxy.opencode.vocabulary import settled_part_id
from proxy.relay.bounded import Bounded
from proxy.relay.hooks import Flow, FlowKey
from rules import OpenTool

log = logging.getLogger(__name__)

_DIRECTORY_HEADER = "x-opencode-directory"
ORPHANS_PER_SESSION = 1_000
"""Orphans kept per session to replay to streams that connect later; the oldest go first."""


@dataclass(slots=True, eq=False)
class Subscriber:
    """One client event stream: its queue, and which events it carries."""

    queue: asyncio.Queue[bytes]
    directory: str | None
    """None on the global stream, or on a plain `/event` while the default directory is unknown."""
    everywhere: bool = False
    """The global stream: every directory, events wrapped with their directory."""
    api: bool = False
    """2.x's `/api/event`: only 2.x's events, unwrapped, of the sessions and directory it asked
    for (`session=…`, `location[directory]=…`; none asked: all)."""
    sessions: frozenset[str] = frozenset()


SUBSCRIBER = FlowKey[Subscriber]("live-settle subscriber")


@dataclass(slots=True)
class Orphan:
    """A part confirmed orphaned, with the events that tell a client so.

    `state` says how things are, and is also sent to streams that connect later. `moment`
    says something just happened (`session.idle`: the web UI plays a sound and notifies), so
    it goes only to streams that were open at that moment.
    """

    place: OpenTool | Place
    state: list[dict[str, Any]] = field(default_factory=list)
    moment: list[dict[str, Any]] = field(default_factory=list)
    api: bool = False
    """2.x's events, for the clients of `/api/event` alone."""


class ClientStreams:
    """Open client streams, and per session its orphans (by key) to replay to later ones."""

    def __init__(self, injected: Counter) -> None:
        self._injected = injected
        self._subscribers: dict[Subscriber, None] = {}
        """An ordered set: each is also kept in its flow (`SUBSCRIBER`)."""
        self._orphans: Bounded[str, Bounded[str, Orphan]] = Bounded(REMEMBERED)
        self.default_directory: str | None = None
        """The server's default directory, which plain `/event` streams follow; None: unknown."""

    def subscribe(self, flow: Flow, *, by: str) -> Subscriber | None:
        """Take `flow` as a client stream if it is one: replay the known state, then inject."""
        if flow.status != 200 or flow.request.method != "GET" or not flow.event_stream:
            return None
        stream = route_of(flow).stream
        if stream is EventStream.GLOBAL:
            subscriber = Subscriber(asyncio.Queue(), None, everywhere=True)
        elif stream is EventStream.INSTANCE:
            asked = _requested_directory(flow.request)
            subscriber = Subscriber(asyncio.Queue(), asked or self.default_directory)
            if subscriber.directory is None:
                log.info(
                    "plain /event stream opened before the server's default directory is known: "
                    "it is told nothing until that is learned",
                    extra={"fields": {"route": "/event", "decision": "waits for the default directory"}},
                )
        elif stream is EventStream.V2:
            subscriber = _api_subscriber(flow.request)
        else:
            return None
        flow.inject(subscriber.queue, by=by)
        self._catch_up(subscriber)
        self._subscribers[subscriber] = None
        flow[SUBSCRIBER] = subscriber
        return subscriber

    def learned_default(self, directory: str) -> None:
        """The server named its default directory: plain `/event` streams that waited for it
        are its streams from now on, caught up with its state."""
        waiting = [s for s in self._subscribers if s.directory is None and not (s.everywhere or s.api)]
        self.default_directory = directory
        for subscriber in waiting:
            subscriber.directory = directory
            self._catch_up(subscriber)
        log.info(
            "plain /event streams follow the server's default directory %s",
            directory,
            extra={"fields": {"directory": directory, "waiting": len(waiting)}},
        )

    def unsubscribe(self, flow: Flow) -> None:
        if (subscriber := flow.get(SUBSCRIBER)) is not None:
            self._subscribers.pop(subscriber, None)

    def heard(self, event: GlobalEvent) -> None:
        """Stop replaying a session's state once the stream says something newer about it."""
        if (session_id := event.session_id) is None or (orphans := self._orphans.get(session_id)) is None:
            return
        if settled_part_id(event.kind, event.properties) not in orphans:
            del self._orphans[session_id]

    def publish(self, key: str, orphan: Orphan) -> None:
        """Send `orphan` to every open stream, and keep it (under `key` in its session) for later ones."""
        session_id = orphan.place.session_id
        self._orphans.setdefault(session_id, Bounded(ORPHANS_PER_SESSION))[key] = orphan
        for subscriber in self._subscribers:
            self._send(subscriber, orphan, live=True)

    def _catch_up(self, subscriber: Subscriber) -> None:
        for orphans in self._orphans.values():
            for orphan in orphans.values():
                self._send(subscriber, orphan, live=False)

    def _send(self, subscriber: Subscriber, orphan: Orphan, *, live: bool) -> None:
        place = orphan.place
        events = orphan.state + orphan.moment if live else orphan.state
        if subscriber.api or orphan.api:
            frames = [event_frame(event) for event in events] if _interested(subscriber, orphan) else []
        elif subscriber.everywhere:
            envelope = {"directory": place.directory, **({"project": place.project} if place.project else {})}
            frames = [event_frame({**envelope, "payload": event}) for event in events]
        elif subscriber.directory is not None and subscriber.directory == place.directory:
            frames = [event_frame(event) for event in events]
        else:
            return
        for frame in frames:
            subscriber.queue.put_nowait(frame)
        self._injected.inc(len(frames))


def _api_subscriber(request: web.Request) -> Subscriber:
    asked = request.query.get("session", "")
    sessions = frozenset(session for session in asked.split(",") if session)
    return Subscriber(asyncio.Queue(), request.query.get("location[directory]"), api=True, sessions=sessions)


def _interested(subscriber: Subscriber, orphan: Orphan) -> bool:
    """Whether a 2.x orphan goes to `subscriber`: a stream of `/api/event` that asked for its
    session (or for all) and for its directory (or for any, or the orphan's is not known)."""
    place, asked = orphan.place, subscriber.directory
    if not (subscriber.api and orphan.api):
        return False
    if subscriber.sessions and place.session_id not in subscriber.sessions:
        return False
    return asked is None or place.directory is None or asked == place.directory


def _requested_directory(request: web.Request) -> str | None:
    if directory := request.query.get("directory"):
        return directory
    header = request.headers.get(_DIRECTORY_HEADER)
    return unquote(header) if header else None
