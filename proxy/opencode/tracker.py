"""Liveness kept from the upstream's own event stream, so a message fetch needs no extra
request in the steady state.

The proxy follows the event stream of the server's line: 1.18's `GET /global/event`, which
carries every directory instance's events (v1 `session.status`/`session.idle`, v2
`session.next.*`), or 2.x's `GET /api/event` (`session.execution.*`, `session.tool.*`, …).
A reading (the upstream's answer to an on-demand look-up, or a v1 status event, or 2.x's end of
an execution) is kept (:mod:`proxy.opencode.readings`) for a session until an event about that
session arrives; status events replace it, any other event about the session drops it, and the
next fetch asks again. While the stream is down, or before it has (re)connected, nothing is
kept: the proxy falls back to asking, never to guessing.

No event may stop that: one that cannot be read (too long, too deep, not JSON) is skipped,
logged once and counted, and since it may have been about any session every kept reading
is dropped; a listener that raises is logged and counted while the others still get the
event; and should following itself ever fail, what is kept is dropped, health says so, and
it starts again.

Other parts of the proxy listen to the same stream through `StreamListener`: each event's
transitions (:mod:`proxy.opencode.sessions`) are decoded as the kept readings take theirs, before
any listener runs, and every listener is handed the same.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

import aiohttp
from aiohttp import hdrs
from yarl import URL

from proxy.opencode.client import basic_as
from proxy.opencode.durable_log import DurableLog
from proxy.opencode.followed_events import (
    PARSERS,
    FollowedEvent,
    UnreadableEvent,
    event_lines,
    liveness_meaning,
    parse_event,
    read_event,
)
from proxy.opencode.following import StreamListener, StreamMetrics, StreamState
from proxy.opencode.readings import KeptReading, KeptReadings
from proxy.opencode.routes import STREAM_START_TIMEOUT_S
from proxy.opencode.server_clock import ServerClock
from proxy.opencode.server_line import TOLD_1_18, KnownServer, ServerLine
from proxy.relay.errors import reason_of
from rules import Api, Liveness

__all__ = [
    "FollowedEvent",
    "KeptReading",
    "LivenessTracker",
    "StreamListener",
    "StreamMetrics",
    "StreamState",
    "liveness_meaning",
    "parse_event",
]

log = logging.getLogger(__name__)

EVENTS_PATH = "/global/event"
SILENCE_LIMIT_S = 35.0
EVENT_LINE_LIMIT = 4 * 2**20
"""The longest event line read: a longer one (a tool's whole output or input) is skipped."""
_RETRY_SECONDS = (0.0, 0.25, 1.0, 2.0, 5.0)
_RESTART_PAUSE_S = 1.0
REDETECT_S = 30.0
"""How often a server whose stream is not followed is asked again which server it is."""


class LivenessTracker:
    """Keeps readings fresh from the event stream of the server at `origin`; `run()` follows it
    until cancelled. The stream is asked with `authorization` (the proxy's own credentials, if
    any), and must start answering within `connect_timeout` (at most STREAM_START_TIMEOUT_S).
    An event line longer than `line_limit` bytes is skipped without being held whole. Nothing is
    followed before `server` says which server this is (given none, it is told 1.18.33), and it
    is asked again each time the stream is lost: the server may have restarted as another."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        origin: URL,
        *,
        authorization: str | None = None,
        connect_timeout: float = 10.0,
        clock: ServerClock | None = None,
        metrics: StreamMetrics | None = None,
        line_limit: int = EVENT_LINE_LIMIT,
        server: ServerLine | None = None,
    ) -> None:
        self._session = session
        self._server = server or ServerLine.told(TOLD_1_18)
        self._origin = origin.origin()
        self._path = EVENTS_PATH
        """The stream followed (or last followed): the detected line's."""
        self._authorization = authorization
        self._connect_timeout = connect_timeout
        self._clock = clock or ServerClock()
        self._metrics = metrics or StreamMetrics.unregistered()
        self._line_limit = line_limit
        self.kept = KeptReadings(self._clock)
        """What the stream vouches for: believed only while it is followed."""
        self._log = DurableLog(line_limit)
        """Where the stream left each session's durable log: from there a reconnection reads what
        the stream missed."""
        self._said: set[str] = set()
        self._unread_said: KnownServer | None = None
        self.state = StreamState.CONNECTING
        self.restarts = 0
        self.last_failure: str | None = None
        """Why following last failed in the proxy itself (for health), if it ever did."""
        self.listeners: list[StreamListener] = []

    def cached(self, api: Api, session_id: str) -> KeptReading | None:
        """The kept reading, or None when the proxy must ask."""
        return self.kept.cached(api, session_id) if self.state is StreamState.FOLLOWING else None

    def store(self, api: Api, liveness: Liveness) -> None:
        """Keep an on-demand reading, valid until the next event about its session."""
        if self.state is StreamState.FOLLOWING:
            self.kept.store(api, liveness)

    def mark_clean(self, session_id: str, view: str) -> None:
        """Remember that `view` showed no open tool, until the next event about its session.

        A tool can only open in a turn, and a turn announces itself on the stream first, so
        until then the view can be sent on unread. Forgetting a mark can only cost a scan;
        a stale one could only skip a settlement, never invent one.
        """
        if self.state is StreamState.FOLLOWING:
            self.kept.mark_clean(session_id, view)

    def known_clean(self, session_id: str, view: str) -> bool:
        return self.state is StreamState.FOLLOWING and self.kept.known_clean(session_id, view)

    async def run(self) -> None:
        """Follow the stream until cancelled. Following only fails by a fault of the proxy's own
        (a lost stream is simply followed again), and then it is started again, from nothing."""
        while True:
            try:
                await self._follow_forever()
            except Exception as error:
                self.restarts += 1
                self.last_failure = f"{type(error).__name__}: {error}"
                self._metrics.restarts.inc()
                log.exception("following %s failed: kept readings dropped, following again", self._path)
            self._forget()
            self.state = StreamState.FAILED
            await asyncio.sleep(_RESTART_PAUSE_S)

    async def _follow_forever(self) -> None:
        """Follow the stream, reconnecting at once and then with growing pauses. A server that
        does not answer yet (starting, restarting) is said once to be waited for; "lost" is
        said only of a stream that was being followed."""
        failures, waiting_said = 0, False
        while True:
            server = await self._server.detected()
            if (unread := self._unread(server)) is not None:
                await self._not_followed(server, unread)
                continue
            why, self._path = "the server ended it", server.dialect.events_path
            try:
                async for event in self._follow(server):
                    failures, waiting_said = 0, False
                    self._take(event)
            except (aiohttp.ClientError, TimeoutError) as error:
                why = reason_of(error)
            if self.state is StreamState.FOLLOWING:
                log.info("event stream %s lost: %s", self._path, why)
            elif self.state is not StreamState.REFUSED and not waiting_said:
                waiting_said = True
                log.info("waiting for the server to answer %s (%s)", self._path, why)
            if self.state is not StreamState.REFUSED:  # lost, or not answered: it may have restarted
                self._server.forget()
            self._forget()
            await asyncio.sleep(_RETRY_SECONDS[min(failures, len(_RETRY_SECONDS) - 1)])
            failures += 1

    @staticmethod
    def _unread(server: KnownServer) -> str | None:
        """Why the stream of `server` is not followed, if it is not."""
        if (refused := server.refusal("follow")) is not None:
            return refused
        if server.dialect.events_path not in PARSERS:
            return f"its stream, {server.dialect.events_path}, is not read by this proxy yet"
        return None

    async def _not_followed(self, server: KnownServer, why: str) -> None:
        """Say once per server that liveness is asked on every fetch, and why; ask again which server
        it is once it restarted (`run` says so), or in a while (a restart could go unseen otherwise)."""
        if self.state is not StreamState.NOT_FOLLOWED or self._unread_said != server:
            log.info("liveness is asked on every fetch: %s", why, extra={"fields": server.describe()})
        self.state, self._unread_said = StreamState.NOT_FOLLOWED, server
        await self._server.until_forgotten(server, REDETECT_S)
        self._server.forget()

    def _take(self, event: FollowedEvent | UnreadableEvent) -> None:
        if isinstance(event, UnreadableEvent):
            self._skip(str(event))
            return
        if self._log.heard(event):
            self._apply(event)

    def _from_log(self, event: FollowedEvent | UnreadableEvent) -> None:
        """An event the durable log delivered: as one of the stream, already in its cursor."""
        if isinstance(event, UnreadableEvent):
            self._skip(str(event))
        else:
            self._apply(event)

    def _apply(self, event: FollowedEvent) -> None:
        if event.session_id is not None:
            self.kept.heard(event.session_id)
        meaning = liveness_meaning(event)
        if meaning is not None:
            self.kept.apply(meaning)
        self._tell("event", lambda listener: listener.event(event))

    def _skip(self, reason: str) -> None:
        """An event that could not be read may have been about any session: nothing kept holds."""
        self.kept.clear()
        self._metrics.unreadable_events.labels(reason).inc()
        if reason not in self._said:
            self._said.add(reason)
            log.warning(
                "an event of %s was skipped (%s); kept readings dropped; further ones are only counted",
                self._path,
                reason,
                extra={"fields": {"reason": reason, "limit": self._line_limit}},
            )

    def _tell(self, hook: str, call: Callable[[StreamListener], None]) -> None:
        """Call every listener that implements `hook`, each isolated from the others as a failing
        addon is."""
        for listener in list(self.listeners):
            if getattr(type(listener), hook) is getattr(StreamListener, hook):
                continue
            try:
                call(listener)
            except Exception:
                name = getattr(listener, "name", type(listener).__name__)
                log.exception("stream listener %s failed in %s; the others still get it", name, hook)
                self._metrics.listener_errors.labels(name, hook).inc()

    def _forget(self) -> None:
        if self.state is StreamState.FOLLOWING:
            self.state = StreamState.CONNECTING
        self.kept.clear()

    async def _follow(self, server: KnownServer) -> AsyncIterator[FollowedEvent | UnreadableEvent]:
        """The stream's events; once it answers, first what it missed while the proxy was away (from
        the durable log, where the server keeps one: `DurableLog.read_missed`), and only then is it
        followed, so that no reading is vouched for, and no listener told the stream is back, before
        that."""
        headers = {hdrs.ACCEPT: "text/event-stream", hdrs.ACCEPT_ENCODING: "identity"}
        if self._authorization:
            headers[hdrs.AUTHORIZATION] = basic_as(self._authorization, self._server.user())
        # A request sent the instant the server's port opens can go unanswered (measured on 1.18.33:
        # 20 s and more): the answer must start within the connect timeout, or it is asked again.
        async with asyncio.timeout(min(self._connect_timeout, STREAM_START_TIMEOUT_S)):
            response = await self._session.get(
                self._origin.with_path(self._path), headers=headers, timeout=aiohttp.ClientTimeout(total=None)
            )
        async with response as stream:
            if stream.status != 200:
                if self.state is not StreamState.REFUSED:
                    log.warning(
                        "%s refused (HTTP %d): liveness is asked on every fetch", self._path, stream.status
                    )
                self.state = StreamState.REFUSED
                return
            self._clock.observe(stream.headers.get(hdrs.DATE))
            self.kept.clear()
            timeout = min(self._connect_timeout, STREAM_START_TIMEOUT_S)
            await self._log.read_missed(
                self._session, self._origin, headers, server, within=timeout, take=self._from_log
            )
            self.state = StreamState.FOLLOWING
            log.info("following %s: liveness now comes from events", self._path)
            self._tell("following", lambda listener: listener.following())
            parse = PARSERS[self._path]
            async for line in event_lines(stream.content, self._line_limit, silence=SILENCE_LIMIT_S):
                if line is None:
                    yield UnreadableEvent("too long")
                elif line.startswith(b"data:") and (event := read_event(line[5:], parse)) is not None:
                    yield event
