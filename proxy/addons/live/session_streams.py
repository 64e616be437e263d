"""The `session-stream-settle` addon: v2 clients following a session's event stream are told, too.

`/api/session/{id}/event` replays the session's durable history and then follows it. After a
crash that history ends with a tool call opened and never closed, and the server adds nothing
until the next prompt in that session, so a client building its state from the stream keeps
the call running. When a client opens such a stream through the proxy, the proxy waits the
grace period, reads the session's messages, confirms with a reading taken after them that the
session is inactive, and unless the followed stream spoke of the session meanwhile
(`confirmations`) sends each of the session's open streams the `session.next.tool.failed` the
server would have sent for every call the rules settle.

The same confirmation runs, without any client asking, for every session the followed stream
showed with a call open when that stream comes back after a loss (a crash and restart): open
session streams are told, and the write-back, if one is configured, is scheduled at once.

The event goes without `durable`: sequence numbers are the server's to give, and a client
resuming with `?after=<seq>` would otherwise skip the server's own event of that number. With
`--write-back`, the server's own durable event follows.

Measured on 1.18.33: a session stream has no heartbeat and sends nothing, not even its response
headers, until it has an event after `after`; a client resuming a stream whose history it has
seen to the end waits for the next event, through the proxy exactly as directly (the proxy can
only speak on a stream the server has opened).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from functools import partial
from typing import Any, ClassVar

from proxy.addons.context import SettleContext
from proxy.addons.live.clients import event_frame
from proxy.addons.live.confirmations import Asked, Confirmer, Judgement, StillHeld, Told, Words, said
from proxy.addons.live.held import Holds
from proxy.addons.routing import event_stream, route_of
from proxy.opencode.routes import EventStream
from proxy.opencode.runtimes import V2_HTTP
from proxy.opencode.sessions import CallClosed, CallOpened
from proxy.opencode.tracker import FollowedEvent, StreamListener
from proxy.opencode.vocabulary import tool_failed
from proxy.relay.bounded import Bounded
from proxy.relay.hooks import Addon, Flow, FlowKey
from proxy.relay.tasks import Together
from rules import Api, Change, Liveness, Settlement, UnexpectedShape, ViewSettlement, settle_view

log = logging.getLogger(__name__)

_REMEMBERED = 10_000
_CALLS_PER_SESSION = 1_000


@dataclass(slots=True, eq=False)
class SessionStream:
    """One client's stream of one session, and the calls it has been told are settled."""

    session_id: str
    queue: asyncio.Queue[bytes] = field(default_factory=asyncio.Queue)
    told: set[str] = field(default_factory=set)


STREAM = FlowKey[SessionStream]("session stream")


@dataclass(frozen=True, slots=True)
class HistoryRead:
    """A session's messages as read afresh, and a reading taken after."""

    document: Any
    liveness: Liveness


class SessionStreamSettle(Addon, StreamListener):
    """Settle orphaned v2 tool calls in the session event streams clients follow, and confirm the
    calls the followed stream left open as soon as it is back. After a loss (rare, and where a
    client may be left spinning) every outcome is logged at INFO, while the confirmation each
    client stream's opening asks for says "nothing to tell" at DEBUG."""

    name: ClassVar[str] = "session-stream-settle"
    words: ClassVar[Words] = Words(
        name, "session streams", "open calls", "stream settle", Api.V2, log, routine=True
    )

    def __init__(self, ctx: SettleContext) -> None:
        self.scope = event_stream
        self._ctx = ctx
        self._confirmer = Confirmer(ctx, self)
        self.tasks: Together = self._confirmer.tasks
        self._streams: dict[SessionStream, None] = {}
        """An ordered set: each is also kept in its flow (`STREAM`)."""
        self._open: Bounded[str, Bounded[str, None]] = Bounded(_REMEMBERED)
        """Per session, the v2 calls the followed stream showed open (a `StreamListener`)."""

    # What the followed stream says: after a loss (a crash, say), sessions it left with calls
    # open are confirmed at once, so that clients and the write-back hear of it before any fetch.

    def following(self) -> None:
        for session_id in list(self._open):
            del self._open[session_id]
            self._confirmer.schedule(session_id)

    def event(self, event: FollowedEvent) -> None:
        self._confirmer.heard(event)
        for change in event.transitions:
            match change:
                case CallOpened(session_id, call, line_2x=False):
                    self._open.setdefault(session_id, Bounded(_CALLS_PER_SESSION))[call] = None
                case CallClosed(session_id, call, line_2x=False) if calls := self._open.get(session_id):
                    calls.pop(call, None)
                    if not calls:
                        del self._open[session_id]

    async def response_headers(self, flow: Flow) -> None:
        if not flow.opened_event_stream:
            return
        route = route_of(flow)
        if route.stream is not EventStream.SESSION or route.stream_session is None:
            return
        stream = SessionStream(route.stream_session)
        flow.inject(stream.queue, by=self.name)
        self._streams[stream] = None
        flow[STREAM] = stream
        self._confirmer.schedule(
            stream.session_id, Asked(self._ctx.probe.credentials(flow.request), loud=False)
        )

    async def done(self, flow: Flow) -> None:
        if (stream := flow.get(STREAM)) is not None:
            self._streams.pop(stream, None)

    async def close(self) -> None:
        """Cancel pending confirmations (application cleanup)."""
        await self.tasks.close()

    async def read(self, session_id: str, asked: Asked) -> HistoryRead:
        """The session's messages read afresh, then a reading."""
        document = await self._ctx.upstream.get(V2_HTTP.messages_path(session_id), asked.credentials)
        return HistoryRead(document, await self._ctx.probe.read(Api.V2, session_id, asked.credentials))

    def judge(self, session_id: str, reading: HistoryRead, asked: Asked) -> Judgement:
        """Each call the rules fail told, then every open stream of the session; calls that only
        the bound of other processes on the database, or the reading's recency, left open are
        confirmed again once what held them back is gone (`held`)."""
        if reading.liveness.active:
            log.log(asked.level, "stream settle of %s: the session is active, nothing told", session_id)
            return Judgement()
        try:
            view = settle_view(reading.document, Api.V2, reading.liveness)
        except UnexpectedShape as error:
            log.info("stream settle of %s: %s", session_id, error)
            return Judgement()
        calls = {} if view is None else _failed_calls(session_id, view)

        def settles(later: Liveness) -> set[str]:
            view = settle_view(reading.document, Api.V2, later)
            return set() if view is None else set(_failed_calls(session_id, view))

        holds = Holds.of(settles, reading.liveness)
        judgement = Judgement(held=[StillHeld(holds, lambda: True)] if holds.calls - calls.keys() else [])
        if not calls:
            log.log(asked.level, "stream settle of %s: no call left open to settle", session_id)
            return judgement
        judgement.told = [self._told(session_id, call_id, call) for call_id, call in calls.items()]
        judgement.told.append(Told(None, publish=partial(self._tell, session_id, calls)))
        return judgement

    def _told(self, session_id: str, call_id: str, call: FailedCall) -> Told:
        fields = {
            "session": session_id,
            "message": call.event["data"]["assistantMessageID"],
            "part": call_id,
            "tool": call.tool,
            "rule": call.rule,
            "api": "v2",
            "why": "open in the session's history; inactive in a reading taken after its messages",
        }
        return Told(
            said("settled", "would settle", "orphaned call in session streams"), fields, write_back=call_id
        )

    def _tell(self, session_id: str, calls: dict[str, FailedCall]) -> None:
        for stream in self._streams:
            if stream.session_id != session_id:
                continue
            for call_id, call in calls.items():
                if call_id not in stream.told:
                    stream.told.add(call_id)
                    stream.queue.put_nowait(event_frame(call.event))
                    self._ctx.metrics.injected_events.inc()


@dataclass(frozen=True, slots=True)
class FailedCall:
    """A call the rules settled: the event that tells a client, and what the log says of it."""

    event: dict[str, Any]
    tool: str | None
    rule: str

    @property
    def call_id(self) -> str:
        return str(self.event["data"]["callID"])


def _failed_calls(session_id: str, view: ViewSettlement) -> dict[str, FailedCall]:
    """The calls a settled view failed, by call id."""
    return {
        call.call_id: call
        for _, settlement in view.messages.settled
        for change in settlement.changes
        if (call := _failed_call(session_id, settlement, change)) is not None
    }


def _failed_call(session_id: str, settlement: Settlement, change: Change) -> FailedCall | None:
    """The failure a change to a tool item stands for (None for any other change)."""
    if not change.on_tool:
        return None
    item = settlement.settled(change)
    if item.get("type") != "tool":
        return None
    event = tool_failed(session_id, change.target.message, item)
    return FailedCall(event, change.target.tool, change.rule)
