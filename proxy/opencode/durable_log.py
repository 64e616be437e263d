"""What 2.x's `/api/event` did not deliver while the follower was away, read from the server's durable
session log where the server keeps one.

`/api/event` is volatile by contract (`Bus.Subscribe`: "nothing before or across a disconnect.
Consumers that need reliability combine it with `log`", `packages/core/src/bus.ts` @2092350cf), and
a subscriber 256 frames behind is ended (`subscriberCapacity`, `packages/server/src/handlers/event.ts`
@014a439e5f02). The log is `GET /api/experimental/session/{id}/log?after=<seq>&follow=false`
(`session.log`, `packages/protocol/src/groups/session.ts` @01fd0c8548b2 and @2092350cf): SSE, one
`data:` line per durable event after the exclusive `after`, framed as on `/api/event` (`durable:
{aggregateID, seq, version}`), then one marker `{type: "log.synced", aggregateID, seq?}`
(`EventLog.Synced`, `packages/schema/src/event-log.ts` @2092350cf; `log.caught_up`, `EventLog.CaughtUp`
@2d6e2bb6e224): the reader holds every event at or below its `seq`. A session the server does not
know is 404 `{_tag: "SessionNotFoundError", sessionID, message}` (measured on @2092350cf).

The cursor of a session is the `durable.seq` of the last of its events heard, so only sessions the
follower heard of are read, the most recent first, at most `LOGGED_SESSIONS`, all within one
deadline. Each read starts one before the cursor: the log must give back the event the stream
showed. The `v2` build @2092350cf gives back none (measured: its `event` table stays empty while
`event_sequence` counts, so its log is the marker alone), nor does 2.1.2 (measured: the marker
alone, with the head's `seq`, even `after=0`), nor a server without the route (404
naming no session): on such a server nothing more is read, said once at INFO, and the stream is
followed exactly as without a log. Frames the stream repeats (the stream is subscribed before the
log is read) are those at or before what the log delivered, and are dropped once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
import orjson
from aiohttp.typedefs import LooseHeaders
from yarl import URL

from proxy.opencode import jsonio
from proxy.opencode.followed_events import (
    FollowedEvent,
    UnreadableEvent,
    api_frame_event,
    event_lines,
    load_frame,
)
from proxy.opencode.server_line import KnownServer
from proxy.relay.bounded import Bounded
from proxy.relay.errors import reason_of

log = logging.getLogger(__name__)

LOGGED_SESSIONS = 64
"""How many sessions (those heard last) are caught up after a loss: each costs one read then."""
MARKERS = frozenset({"log.synced", "log.caught_up"})
STALL_S = 30.0
"""The longest wait for a line of a log (the reads' deadline is shorter, and ends them first)."""
Take = Callable[[FollowedEvent | UnreadableEvent], None]


class _Absent(Exception):
    """The server keeps no log the proxy can read (why)."""


class DurableLog:
    """The follower's cursor into each session's durable log, and the reads of what the stream missed."""

    def __init__(self, line_limit: int, *, capacity: int = LOGGED_SESSIONS) -> None:
        self._line_limit = line_limit
        self._cursors: Bounded[str, int] = Bounded(capacity)
        self._replayed: Bounded[str, int] = Bounded(capacity)
        """What the last read delivered of each session: the stream's repeats are at or before it."""
        self.absent_on: KnownServer | None = None
        """The server (as detected) whose log gives nothing back: not read again until it changes."""
        self._said: set[str] = set()

    def heard(self, event: FollowedEvent) -> bool:
        """Move the session's cursor for an event of the stream; False for one the log delivered."""
        if event.seq is None or (session_id := event.session_id) is None:
            return True
        replayed, cursor = self._replayed.peek(session_id), self._cursors.peek(session_id)
        if replayed is not None and event.seq <= replayed:
            return False
        self._cursors[session_id] = event.seq if cursor is None else max(event.seq, cursor)
        return True

    async def read_missed(
        self, http: aiohttp.ClientSession, origin: URL, headers: LooseHeaders, server: KnownServer,
        *, within: float, take: Take,
    ) -> None:  # fmt: skip
        """Hand `take` each durable event after the cursors, session by session, in log order. A read
        that fails or stalls ends the reads, all of them within `within` seconds."""
        self._replayed.clear()
        if (path := server.dialect.session_log) is None or self.absent_on == server:
            return
        deadline = asyncio.get_running_loop().time() + within
        for session_id, cursor in reversed(list(self._cursors.items())):
            url = origin.with_path(path.format(session=session_id))
            try:
                async with asyncio.timeout_at(deadline):
                    await self._read(http, url.with_query(_after(cursor)), headers, cursor, take=take)
            except _Absent as why:
                self.absent_on = server
                log.info(
                    "the server keeps no durable session log the proxy can read (%s): what /api/event "
                    "missed while the proxy was away is confirmed by asking, as before",
                    why,
                    extra={"fields": server.describe()},
                )
                return
            except (aiohttp.ClientError, TimeoutError) as error:
                self._once(f"reading the durable log of {session_id} failed: {reason_of(error)}")
                return

    async def _read(
        self, http: aiohttp.ClientSession, url: URL, headers: LooseHeaders, cursor: int, *, take: Take
    ) -> None:  # fmt: skip
        async with http.get(url, headers=headers) as response:
            session_id = response.url.path.rsplit("/", 2)[-2]
            if response.status == 404:
                if await self._gone(response, session_id):
                    return
                raise _Absent(f"HTTP 404 on {response.url.path}")
            if response.status != 200:
                self._once(f"the durable log of {session_id} answered HTTP {response.status}")
                return
            delivered, marker = 0, None
            async for line in event_lines(response.content, self._line_limit, silence=STALL_S):
                item = _item(line)
                if isinstance(item, _Marker):
                    marker = item
                elif item is not None:
                    delivered += 1
                    self._deliver(item, session_id, take)
        if marker is None or delivered > 0:
            return
        if marker.seq is not None and marker.seq < cursor:  # another database: its seqs are not ours
            self._cursors[session_id] = marker.seq
            return
        if marker.seq is None:
            raise _Absent(f"its log of {session_id} holds nothing but the stream showed seq {cursor}")
        gave = f"its log of {session_id} gave back no event, only its head, seq {marker.seq}"
        raise _Absent(f"{gave}, though the stream showed seq {cursor}")

    def _deliver(self, item: FollowedEvent | UnreadableEvent, session_id: str, take: Take) -> None:
        """One line of the log: what the stream already showed (at or before the cursor) is dropped."""
        if isinstance(item, FollowedEvent):
            if item.seq is None or item.session_id != session_id:
                return
            if item.seq <= self._cursors.get(session_id, -1):
                return
            self._cursors[session_id] = self._replayed[session_id] = item.seq
        take(item)

    async def _gone(self, response: aiohttp.ClientResponse, session_id: str) -> bool:
        """Whether a 404 names the session (gone: its cursor is forgotten), not the route."""
        try:
            body = jsonio.loads(await response.read())
        except (orjson.JSONDecodeError, RecursionError):
            return False
        if isinstance(body, dict) and body.get("sessionID") == session_id:
            self._cursors.pop(session_id, None)
            return True
        return False

    def _once(self, what: str) -> None:
        if what not in self._said:
            self._said.add(what)
            log.info("%s: the stream is followed, what it missed confirmed by asking", what)


@dataclass(frozen=True, slots=True)
class _Marker:
    """The end of a read: every event at or before `seq` was delivered (None: the log is empty)."""

    seq: int | None


def _after(cursor: int) -> dict[str, str]:
    """A read from one before the cursor (`after` is exclusive; absent, from the first event, seq 0)."""
    return {"follow": "false"} | ({"after": str(cursor - 1)} if cursor > 0 else {})


def _item(line: bytes | None) -> FollowedEvent | UnreadableEvent | _Marker | None:
    """One line of the log: an event, its marker, or nothing."""
    if line is None:
        return UnreadableEvent("too long")
    if not line.startswith(b"data:"):
        return None
    try:
        body = load_frame(line[5:])
    except UnreadableEvent as error:
        return error
    if body.get("type") in MARKERS:
        seq = body.get("seq")
        return _Marker(seq if isinstance(seq, int) and not isinstance(seq, bool) else None)
    return api_frame_event(body)
