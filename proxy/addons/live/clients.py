"""The client event streams open through the proxy, for the live-settle addon.

Each client stream (`/global/event`, or `/event` of one directory) gets a queue the relay
slips events from; what the addon announces goes to every open stream now and, as state,
to streams that open later (`replay`: each thing's state until news of that same thing).
A stream that opens after the followed stream was lost (a client coming back after a crash) is
said in the log, with what it is replayed.

A plain `/event` (no directory asked) is the stream of the server's default directory
(`default_directory`). One that opens while that directory is not known waits, told nothing, and
is caught up (as a stream opening then) as soon as it is learned.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from aiohttp import web
from prometheus_client import Counter

from proxy.addons.live.catch_up import CatchUp
from proxy.addons.live.memory import Place
from proxy.addons.live.replay import Replayed, Replays
from proxy.addons.routing import route_of
from proxy.opencode import jsonio
from proxy.opencode.followed_events import FollowedEvent
from proxy.opencode.routes import EventStream
from proxy.relay.hooks import Flow, FlowKey
from rules import OpenTool

log = logging.getLogger(__name__)

_DIRECTORY_HEADER = "x-opencode-directory"
_SAID = 10
"""Replayed events named in the log line of a stream that opens (the count is always given)."""
CATCH_UP_WAIT = 2.0
"""How long a stream that came back waits, after its first event, for the followed stream to be
read up to it (what it missed meanwhile is sent first); past it, its own events go on."""


@dataclass(slots=True, eq=False)
class Subscriber:
    """One client event stream: its queue, and which events it carries."""

    queue: asyncio.Queue[bytes]
    directory: str | None
    """None on the global stream, or on a plain `/event` while the default directory is unknown."""
    everywhere: bool = False
    """The global stream: every directory, events wrapped with their directory."""
    line_2x: bool = False
    """2.x's `/api/event`: only 2.x's events, unwrapped, of the sessions and directory it asked
    for (`session=…`, `location[directory]=…`; none asked: all)."""
    sessions: frozenset[str] = frozenset()
    catch_up: CatchUp | None = None
    """Of a stream that opened after the followed stream was lost: what it missed since its replay."""


SUBSCRIBER = FlowKey[Subscriber]("live-settle subscriber")


@dataclass(slots=True)
class Telling:
    """What a confirmation tells the client streams (a part settled, a turn closed, a notice for
    a person), with the events that tell it.

    `state` says how things are, and is also sent to streams that connect later. `moment`
    says something just happened (`session.idle`: the web UI plays a sound and notifies), so
    it goes only to streams that were open at that moment.
    """

    place: OpenTool | Place
    state: list[dict[str, Any]] = field(default_factory=list)
    moment: list[dict[str, Any]] = field(default_factory=list)
    line_2x: bool = False
    """2.x's events, for the clients of `/api/event` alone."""


class ClientStreams:
    """Open client streams, and what to replay to later ones."""

    def __init__(self, injected: Counter) -> None:
        self._injected = injected
        self._subscribers: dict[Subscriber, None] = {}
        """An ordered set: each is also kept in its flow (`SUBSCRIBER`)."""
        self.replays = Replays()
        self.default_directory: str | None = None
        """The server's default directory, which plain `/event` streams follow; None: unknown."""
        self.lost = False
        """Whether the followed stream was ever lost: a stream opening since may be a client back."""

    def subscribe(self, flow: Flow, *, by: str) -> Subscriber | None:
        """Take `flow` as a client stream if it is one: replay the known state, then inject."""
        if not flow.opened_event_stream:
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
        opened = None
        if self.lost and not subscriber.line_2x:
            subscriber.catch_up = CatchUp(flow.request.path)
            opened = functools.partial(self._opened, subscriber)
        flow.inject(subscriber.queue, by=by, opened=opened)
        replayed = self._catch_up(subscriber)
        if self.lost:
            _log_back(flow.request.path, subscriber, replayed)
        self._subscribers[subscriber] = None
        flow[SUBSCRIBER] = subscriber
        return subscriber

    def learned_default(self, directory: str) -> None:
        """The server named its default directory: plain `/event` streams that waited for it
        are its streams from now on, caught up with its state."""
        waiting = [s for s in self._subscribers if s.directory is None and not (s.everywhere or s.line_2x)]
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

    def heard(self, event: FollowedEvent) -> None:
        """What the stream says of a session ends (or renews) the replay of that same thing, and
        goes to the streams that came back and missed it."""
        self.replays.heard(event)
        for subscriber in self._subscribers:
            if (catch_up := subscriber.catch_up) is not None:
                self._missed(subscriber, catch_up, catch_up.hear(event))

    def _opened(self, subscriber: Subscriber, first: bytes) -> Awaitable[None] | None:
        """A stream that came back has its first event: it is sent what it missed since its
        replay, and its own events wait until the followed stream has read up to them."""
        if (catch_up := subscriber.catch_up) is None:
            return None
        self._missed(subscriber, catch_up, catch_up.opened(first))
        return self._caught_up(subscriber, catch_up)

    async def _caught_up(self, subscriber: Subscriber, catch_up: CatchUp) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CATCH_UP_WAIT):
                await catch_up.over.wait()
        subscriber.catch_up = None  # its own events go on now: one missed later would land after newer ones
        _log_caught_up(catch_up, subscriber)

    def _missed(self, subscriber: Subscriber, catch_up: CatchUp, missed: list[FollowedEvent]) -> None:
        """Send `subscriber` what it missed, of the sessions with a replay, as the server said it."""
        told = [event for event in missed if event.session_id in self.replays.sessions and not event.line_2x]
        for event in told:
            place = Place(str(event.session_id), "", event.directory, event.project)
            said = {"id": event.id, "type": event.kind, "properties": event.properties}
            self._send(subscriber, place, [said], line_2x=False)
        catch_up.sent(told)
        if catch_up.over.is_set():
            subscriber.catch_up = None

    def publish(self, key: str, telling: Telling) -> None:
        """Send `telling` to every open stream, and keep its state (`key`: what it says) for later ones."""
        self.replays.keep(key, telling.place, telling.state, line_2x=telling.line_2x)
        for subscriber in self._subscribers:
            self._send(subscriber, telling.place, telling.state + telling.moment, line_2x=telling.line_2x)

    def _catch_up(self, subscriber: Subscriber) -> list[Replayed]:
        """Replay the kept state to a stream opening now; what it was replayed."""
        return [
            r for r in self.replays.all() if self._send(subscriber, r.place, [r.event], line_2x=r.line_2x)
        ]

    def _send(
        self, subscriber: Subscriber, place: OpenTool | Place, events: list[dict[str, Any]], *, line_2x: bool
    ) -> bool:
        """Queue `events` (of `place`, 2.x's if `line_2x`) if the stream carries them; whether it does."""
        if subscriber.line_2x or line_2x:
            if not _interested(subscriber, place, line_2x=line_2x):
                return False
            frames = [event_frame(event) for event in events]
        elif subscriber.everywhere:
            envelope = {"directory": place.directory, **({"project": place.project} if place.project else {})}
            frames = [event_frame({**envelope, "payload": event}) for event in events]
        elif subscriber.directory is not None and subscriber.directory == place.directory:
            frames = [event_frame(event) for event in events]
        else:
            return False
        for frame in frames:
            subscriber.queue.put_nowait(frame)
        self._injected.inc(len(frames))
        return True


def _log_back(route: str, subscriber: Subscriber, replayed: list[Replayed]) -> None:
    said = [f"{r.event.get('type')} of {r.place.session_id}" for r in replayed[:_SAID]]
    log.info(
        "client stream %s opened after the server was lost: replayed %d event(s)%s",
        route,
        len(replayed),
        f": {', '.join(said)}{', …' if len(replayed) > _SAID else ''}" if said else "",
        extra={
            "fields": {
                "route": route,
                "directory": "every" if subscriber.everywhere else subscriber.directory,
                "replayed": len(replayed),
                "decision": "replayed" if replayed else "nothing to replay",
            }
        },
    )


def _log_caught_up(catch_up: CatchUp, subscriber: Subscriber) -> None:
    said, count = catch_up.told, catch_up.told_count
    caught_up = catch_up.over.is_set()
    log.log(
        logging.INFO if count else logging.DEBUG,  # what it was replayed is said at INFO already
        "client stream %s back after the server was lost: sent %d event(s) it missed before the "
        "server took it%s%s",
        catch_up.route,
        count,
        f": {', '.join(said)}{', …' if count > len(said) else ''}" if said else "",
        "" if caught_up else f"; the followed stream was not read up to it within {CATCH_UP_WAIT:g} s",
        extra={
            "fields": {
                "route": catch_up.route,
                "directory": "every" if subscriber.everywhere else subscriber.directory,
                "missed": count,
                "decision": "caught up" if caught_up else "went on before catching up",
            }
        },
    )


def _api_subscriber(request: web.Request) -> Subscriber:
    asked = request.query.get("session", "")
    sessions = frozenset(session for session in asked.split(",") if session)
    return Subscriber(
        asyncio.Queue(), request.query.get("location[directory]"), line_2x=True, sessions=sessions
    )


def _interested(subscriber: Subscriber, place: OpenTool | Place, *, line_2x: bool) -> bool:
    """Whether 2.x's news of `place` goes to `subscriber`: a stream of `/api/event` that asked for
    its session (or for all) and for its directory (or for any, or the place's is not known)."""
    asked = subscriber.directory
    if not (subscriber.line_2x and line_2x):
        return False
    if subscriber.sessions and place.session_id not in subscriber.sessions:
        return False
    return asked is None or place.directory is None or asked == place.directory


def _requested_directory(request: web.Request) -> str | None:
    if directory := request.query.get("directory"):
        return directory
    header = request.headers.get(_DIRECTORY_HEADER)
    return unquote(header) if header else None


def event_frame(envelope: object) -> bytes:
    """One SSE event carrying `envelope` as JSON, framed as opencode frames its own (the relay
    only slips the frames in; the events themselves are built by :mod:`proxy.opencode.vocabulary`)."""
    return b"data: " + jsonio.dumps(envelope) + b"\n\n"
