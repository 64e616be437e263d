"""Closing, in client streams, a turn that died before it called a tool, for the live-settle addon.

The stream showed the session busy and its assistant message unfinished, and a client keeps
its busy bar. When the stream comes back, wait the grace period, read each such message
afresh, take a reading after that read, and if the session is inactive and the stream did not
speak of it meanwhile (`confirmations`) send the message as the rules close it (`message.updated`)
and `session.status` idle.

The same is owed for a part settled as a crash's interruption that this process never saw open
(a write-back of it or of the proxy that ran before it, after the proxy itself crashed and a new
one started on the same data): the server announces the part, never the session idle nor the
message closed, and a client that kept its state across (the TUI) keeps its busy bar for good. So
unless this process already told the session idle since (or the server did), its message is
confirmed and closed the same way, and the session told idle once a reading says it is inactive.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar, TypeVar

from proxy.addons.context import SettleContext
from proxy.addons.live.clients import ClientStreams, Telling
from proxy.addons.live.confirmations import Asked, Confirmer, Judgement, Told, Words, said
from proxy.addons.live.memory import Place, StreamMemory
from proxy.opencode.liveness import LivenessUnknown
from proxy.opencode.runtimes import V1_HTTP
from proxy.opencode.tracker import FollowedEvent
from proxy.opencode.vocabulary import (
    SESSION_STATUS,
    idle_status,
    message_updated,
    session_idle,
    settled_part_id,
)
from rules import V1, Api, Liveness, OpenTool, UnexpectedShape, settle_view

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TurnsRead:
    """Each unfinished message where it lives, as read afresh, and a reading taken after."""

    messages: list[tuple[Place, Any]]
    liveness: Liveness


class DeadTurns:
    """One confirmation at a time per session; any event about the session withdraws it."""

    words: ClassVar[Words] = Words(
        "live-settle turns", "dead turns", "dead turns", "live settle of turn", Api.V1, log
    )

    def __init__(self, ctx: SettleContext, memory: StreamMemory, clients: ClientStreams) -> None:
        self._ctx = ctx
        self._memory = memory
        self._clients = clients
        self._confirmer = Confirmer(ctx, self)
        self.tasks = self._confirmer.tasks

    def schedule(self, session_id: str) -> None:
        self._confirmer.schedule(session_id)

    def heard(self, event: FollowedEvent) -> None:
        self._confirmer.heard(event)
        if (place := _settled_unseen(event)) is not None:
            self._owed([place], f"part of {place.session_id} settled as interrupted, not seen open here")

    def view_settled(self, session_id: str, messages: list[str]) -> None:
        """A client's fetch settled the session's unfinished `messages` (no part of theirs)."""
        places = [Place(session_id, message_id, None, None) for message_id in messages]
        self._owed(places, f"view of {session_id} settled")

    def _owed(self, places: list[Place], said: str) -> None:
        """A settlement of the session's `places` was made that no client stream may have been
        told the end of: unless its parts' confirmation tells the whole story, or the session was
        told idle since (by the proxy or the server), its turn is confirmed over and told so."""
        session_id = places[0].session_id
        if self._memory.has_open(session_id) or self._clients.replays.told_idle(session_id):
            return
        log.info(
            "%s: its turn is closed in client streams once a reading says the session is inactive",
            said,
            extra={"fields": {"session": session_id, "decision": "close turn"}},
        )
        for place in places:
            known = self._memory.unfinished.get(place.message_id)
            if known is None or known.directory is None:
                self._memory.unfinished[place.message_id] = place
        self.schedule(session_id)

    def judge(self, session_id: str, reading: TurnsRead, asked: Asked) -> Judgement:
        """Each message closed, then the session idle; nothing unless the rules close every one."""
        busy = self._memory.busy.get(session_id)
        closed = self._closed(session_id, reading.messages, reading.liveness)
        if closed is None or not (closed or busy):
            return Judgement()  # not vouched for: the turn is left alone
        self._memory.busy.pop(session_id, None)
        judgement = Judgement()
        for place, info in closed:
            fields = {
                "session": session_id,
                "message": place.message_id,
                "rule": "unfinished-message",
                "api": "v1",
                "why": "unfinished when the server went away; inactive in a reading taken after it",
            }
            publish = partial(self._announce, place, [message_updated(session_id, info)])
            judgement.told.append(
                Told(said("closed", "would close", "unfinished message in client streams"), fields, publish)
            )
        place = busy if busy is not None else closed[-1][0]
        judgement.told.append(Told(None, publish=partial(self._announce, place, [idle_status(session_id)])))
        return judgement

    async def read(self, session_id: str, asked: Asked) -> TurnsRead | None:
        """Each unfinished message read afresh, then a reading; None while a part of the session
        is open (the parts' own confirmation tells the whole story)."""
        if self._memory.has_open(session_id):
            return None
        read = [
            (
                await placed(self._ctx, place),
                await self._ctx.upstream.get(V1_HTTP.messages_path(session_id, mid), asked.credentials),
            )
            for mid, place in self._memory.unfinished_messages(session_id)
        ]
        return TurnsRead(read, await self._ctx.probe.read(Api.V1, session_id, asked.credentials))

    def _closed(
        self, session_id: str, read: list[tuple[Place, Any]], liveness: Liveness
    ) -> list[tuple[Place, dict[str, Any]]] | None:
        """Each message's info as the rules close it; None as soon as one is not vouched for
        (too fresh, or another process): then the turn is left alone."""
        closed = []
        for place, message in read:
            try:
                view = settle_view(message, Api.V1, liveness, single=True)
            except UnexpectedShape as error:
                log.info("live settle of turn %s: %s", session_id, error)
                return None
            info = (view.document if view is not None else message)["info"]
            if "completed" not in info["time"]:
                return None
            self._memory.unfinished.pop(place.message_id, None)
            closed.append((place, info))
        return closed

    def _announce(self, place: Place, state: list[dict[str, Any]]) -> None:
        """Send `state` to every client stream now (with `session.idle` after an idle status),
        and to streams that open later until the stream says something newer of that same thing."""
        idle = state[-1]["type"] == SESSION_STATUS
        moment = [session_idle(place.session_id)] if idle else []
        self._clients.publish(place.message_id or "status", Telling(place, state, moment))


def _settled_unseen(event: FollowedEvent) -> Place | None:
    """Where a v1 tool part `event` shows settled as a crash's interruption lives (None: it shows
    none), as the server announces a write-back's."""
    if event.line_2x or event.session_id is None or settled_part_id(event.kind, event.properties) is None:
        return None
    part = event.properties["part"]
    state, message_id = part.get("state"), part.get("messageID")
    if not isinstance(state, dict) or not isinstance(message_id, str) or not V1.settled_as_interrupted(state):
        return None
    return Place(event.session_id, message_id, event.directory, event.project)


P = TypeVar("P", Place, OpenTool)


async def placed(ctx: SettleContext, thing: P) -> P:
    """`thing` with its session's directory (what `/global/event` and `/event` are framed by),
    asked of the server when only a view named it."""
    if thing.directory is not None:
        return thing
    session_id = thing.session_id
    info = await ctx.upstream.get(f"/session/{session_id}", ctx.credentials)
    directory = info.get("directory") if isinstance(info, dict) else None
    if not isinstance(directory, str):
        raise LivenessUnknown(f"/session/{session_id}: no `directory`")
    return dataclasses.replace(thing, directory=directory)
