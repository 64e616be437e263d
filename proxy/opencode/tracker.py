"""Liveness kept from the upstream's own event stream, so a message fetch needs no extra
request in the steady state.

The proxy follows `GET /global/event`, which carries every directory instance's events
(v1 `session.status`/`session.idle`, v2 `session.next.*`). A reading (the upstream's
answer to an on-demand look-up, or a v1 status event) is kept for a session until an
event about that session arrives; v1 status events replace it, any other event about the
session drops it, and the next fetch asks again. While the stream is down, or before it
has (re)connected, nothing is kept: the proxy falls back to asking, never to guessing.

Other parts of the proxy listen to the same stream through `StreamListener`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

import aiohttp
import orjson
from aiohttp import hdrs, web
from yarl import URL

from proxy.opencode import jsonio
from proxy.opencode.routes import STREAM_START_TIMEOUT_S
from proxy.opencode.server_clock import ServerClock
from rules import Api, Liveness

log = logging.getLogger(__name__)

EVENTS_PATH = "/global/event"
SILENCE_LIMIT_S = 35.0
_RETRY_SECONDS = (0.0, 0.25, 1.0, 2.0, 5.0)
_V1_BUSY = ("busy", "retry")


class StreamState(StrEnum):
    CONNECTING = "connecting"
    FOLLOWING = "following"
    REFUSED = "refused"
    """The upstream refused the subscription (HTTP error, e.g. 401 without credentials)."""


@dataclass(frozen=True, slots=True)
class GlobalEvent:
    """One plain event of `/global/event`: `{"directory", "project"?, "payload": {type, properties}}`."""

    directory: str | None
    project: str | None
    kind: str
    properties: dict[str, Any]

    @property
    def session_id(self) -> str | None:
        session = self.properties.get("sessionID")
        return session if isinstance(session, str) else None


@dataclass(frozen=True, slots=True)
class SessionEvent:
    """What an event says about one session's liveness."""

    session_id: str
    api: Api
    busy: bool | None
    """True/False when the event states it (v1 status); None when it only says "something happened"."""


@runtime_checkable
class StreamListener(Protocol):
    """Something else that wants the stream's events (after the tracker has applied them)."""

    def following(self) -> None:
        """The stream has (re)connected: whatever happened while it was down was not seen."""

    def event(self, event: GlobalEvent) -> None:
        """One event, in stream order."""


@dataclass(frozen=True, slots=True)
class KeptReading:
    """A reading the stream still vouches for. Its `taken_at` is in the server's clock: the
    `Date` of an asked reading, or for a status event the time it arrived, by the offset the
    stream's (or the latest liveness answer's) `Date` measured."""

    liveness: Liveness


class LivenessTracker:
    """Keeps readings fresh from the event stream of the server at `origin`; `run()` follows it
    until cancelled. The stream is asked with `authorization` (the proxy's own credentials, if
    any), and must start answering within `connect_timeout` (at most STREAM_START_TIMEOUT_S)."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        origin: URL,
        *,
        authorization: str | None = None,
        connect_timeout: float = 10.0,
        clock: ServerClock | None = None,
    ) -> None:
        self._session = session
        self._url = origin.origin().with_path(EVENTS_PATH)
        self._authorization = authorization
        self._connect_timeout = connect_timeout
        self._clock = clock or ServerClock()
        self._readings: dict[tuple[Api, str], KeptReading] = {}
        self._clean: dict[str, set[str]] = {}
        """Per session, the views (path and query) last seen without an open tool."""
        self.state = StreamState.CONNECTING
        self.listeners: list[StreamListener] = []

    def cached(self, api: Api, session_id: str) -> KeptReading | None:
        """The kept reading, or None when the proxy must ask."""
        if self.state is not StreamState.FOLLOWING:
            return None
        return self._readings.get((api, session_id))

    def store(self, api: Api, liveness: Liveness) -> None:
        """Keep an on-demand reading, valid until the next event about its session."""
        if self.state is StreamState.FOLLOWING:
            self._readings[(api, liveness.session_id)] = KeptReading(liveness)

    def mark_clean(self, session_id: str, view: str) -> None:
        """Remember that `view` showed no open tool, until the next event about its session.

        A tool can only open in a turn, and a turn announces itself on the stream first, so
        until then the view can be sent on unread. Forgetting a mark can only cost a scan;
        a stale one could only skip a settlement, never invent one.
        """
        if self.state is StreamState.FOLLOWING:
            self._clean.setdefault(session_id, set()).add(view)

    def known_clean(self, session_id: str, view: str) -> bool:
        return self.state is StreamState.FOLLOWING and view in self._clean.get(session_id, ())

    def apply(self, event: SessionEvent) -> None:
        key = (event.api, event.session_id)
        if event.busy is None:
            self._readings.pop(key, None)
        else:
            self._readings[key] = KeptReading(Liveness(event.session_id, event.busy, self._clock.now()))

    async def run(self) -> None:
        """Follow the stream forever, reconnecting at once and then with growing pauses."""
        failures = 0
        while True:
            try:
                async for event in self._follow():
                    failures = 0
                    if event.session_id is not None:
                        self._clean.pop(event.session_id, None)
                    meaning = liveness_meaning(event)
                    if meaning is not None:
                        self.apply(meaning)
                    for listener in self.listeners:
                        listener.event(event)
            except (aiohttp.ClientError, TimeoutError) as error:
                log.info("event stream %s lost: %s", EVENTS_PATH, error or type(error).__name__)
            self._forget()
            await asyncio.sleep(_RETRY_SECONDS[min(failures, len(_RETRY_SECONDS) - 1)])
            failures += 1

    def _forget(self) -> None:
        if self.state is StreamState.FOLLOWING:
            self.state = StreamState.CONNECTING
        self._readings.clear()
        self._clean.clear()

    async def _follow(self) -> AsyncIterator[GlobalEvent]:
        headers = {hdrs.ACCEPT: "text/event-stream", hdrs.ACCEPT_ENCODING: "identity"}
        if self._authorization:
            headers[hdrs.AUTHORIZATION] = self._authorization
        # A request sent the instant the server's port opens can go unanswered (measured on 1.18.33:
        # 20 s and more): the answer must start within the connect timeout, or it is asked again.
        async with asyncio.timeout(min(self._connect_timeout, STREAM_START_TIMEOUT_S)):
            response = await self._session.get(
                self._url, headers=headers, timeout=aiohttp.ClientTimeout(total=None)
            )
        async with response as stream:
            if stream.status != 200:
                if self.state is not StreamState.REFUSED:
                    log.warning(
                        "%s refused (HTTP %d): liveness is asked on every fetch", EVENTS_PATH, stream.status
                    )
                self.state = StreamState.REFUSED
                return
            self._clock.observe(stream.headers.get(hdrs.DATE))
            self._readings.clear()
            self.state = StreamState.FOLLOWING
            log.info("following %s: liveness now comes from events", EVENTS_PATH)
            for listener in self.listeners:
                listener.following()
            while line := await _next_line(stream):
                if line.startswith(b"data:"):
                    event = parse_event(line[5:])
                    if event is not None:
                        yield event


async def _next_line(stream: aiohttp.ClientResponse) -> bytes:
    """The stream's next line; a stream silent for longer than `SILENCE_LIMIT_S` counts as lost
    (the server sends a heartbeat every 10 s, so silence means a dead connection)."""
    async with asyncio.timeout(SILENCE_LIMIT_S):
        return await stream.content.readline()


def parse_event(data: bytes) -> GlobalEvent | None:
    """One `/global/event` payload, or None for what is not a plain event (sync forms, junk)."""
    try:
        envelope = jsonio.loads(data)
    except orjson.JSONDecodeError:
        return None
    payload = envelope.get("payload") if isinstance(envelope, dict) else None
    if not isinstance(payload, dict):
        return None
    kind, properties = payload.get("type"), payload.get("properties")
    if not isinstance(kind, str) or not isinstance(properties, dict):
        return None
    directory, project = envelope.get("directory"), envelope.get("project")
    return GlobalEvent(
        directory if isinstance(directory, str) else None,
        project if isinstance(project, str) else None,
        kind,
        properties,
    )


def liveness_meaning(event: GlobalEvent) -> SessionEvent | None:
    """What an event says about its session's liveness, if anything."""
    session_id = event.session_id
    if session_id is None:
        return None
    if event.kind == "session.status":
        status = event.properties.get("status") or {}
        return SessionEvent(session_id, Api.V1, status.get("type") in _V1_BUSY)
    if event.kind == "session.idle":
        return SessionEvent(session_id, Api.V1, False)
    if event.kind.startswith("session.next."):
        return SessionEvent(session_id, Api.V2, None)
    return None


TRACKER = web.AppKey("tracker", LivenessTracker)
