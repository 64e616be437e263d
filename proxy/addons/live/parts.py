"""Confirming the v1 tool parts the stream left open, for the live-settle addon.

When the stream comes back after a loss, or a session goes idle while one of its parts is
still open, wait the grace period, read the messages afresh, then take a reading (a turn that
starts after the read shows in it), and unless the stream spoke of the session meanwhile
(`confirmations`) tell every client stream what the server would have sent had it settled the
part itself, and schedule the write-back.

The server itself may settle a part while it is being confirmed (another client's fetch wrote
it back, say): that agrees with what would be told, so it is not news that withdraws the
confirmation, and the part stays in it. Clients open then heard the server; a client that
connects later (the TUI, which never fetches again) must still be told, and so must every client
of the session's idle status, which the server's write-back does not announce.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar

from proxy.addons.context import SettleContext
from proxy.addons.live.clients import ClientStreams, Telling
from proxy.addons.live.confirmations import (
    Asked,
    Confirmer,
    Judgement,
    StillHeld,
    Told,
    Words,
    read_messages,
    said,
)
from proxy.addons.live.held import Holds
from proxy.addons.live.memory import StreamMemory
from proxy.addons.live.turns import placed
from proxy.opencode.runtimes import V1_HTTP
from proxy.opencode.tracker import FollowedEvent
from proxy.opencode.vocabulary import is_open_tool, part_settled, session_idle, settled_part_id
from rules import Api, Liveness, OpenTool, settle_view

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PartsRead:
    """The parts the stream showed open, their messages as read afresh, and a reading taken after."""

    parts: list[OpenTool]
    messages: dict[str, Any]
    liveness: Liveness


class OpenParts:
    """One confirmation at a time per session, of the parts the stream last showed open there;
    any news of the session withdraws it."""

    words: ClassVar[Words] = Words("live-settle", "open parts", "open parts", "live settle", Api.V1, log)

    def __init__(self, ctx: SettleContext, memory: StreamMemory, clients: ClientStreams) -> None:
        self._ctx = ctx
        self._memory = memory
        self._clients = clients
        self._settled_meanwhile: dict[str, dict[str, OpenTool]] = {}
        """Per session under confirmation, the open parts the server settled meanwhile."""
        self._confirmer = Confirmer(
            ctx, self, ended=lambda session_id: self._settled_meanwhile.pop(session_id, None)
        )
        self.tasks = self._confirmer.tasks

    def schedule(self, session_id: str) -> None:
        self._confirmer.schedule(session_id)

    def heard(self, event: FollowedEvent) -> None:
        settled = self._open_part_settled(event)
        if settled is not None and self._confirmer.under_way(settled.session_id):
            self._settled_meanwhile.setdefault(settled.session_id, {})[settled.part] = settled
            return
        self._confirmer.heard(event)

    def _open_part_settled(self, event: FollowedEvent) -> OpenTool | None:
        """The remembered open part `event` shows settled, if it does."""
        part_id = settled_part_id(event.kind, event.properties)
        return self._memory.parts.get(part_id) if part_id is not None else None

    async def read(self, session_id: str, asked: Asked) -> PartsRead | None:
        """The parts the stream still shows open, their messages read afresh, then a reading."""
        parts = self._memory.open_parts(session_id) + list(
            self._settled_meanwhile.get(session_id, {}).values()
        )
        if not parts:
            return None
        parts = [await placed(self._ctx, part) for part in parts]
        path = partial(V1_HTTP.messages_path, session_id)
        gone = partial(self._gone, session_id, parts)
        messages = await read_messages(self._ctx, asked, path, (part.message_id for part in parts), gone)
        liveness = await self._ctx.probe.read(Api.V1, session_id, asked.credentials)
        return PartsRead(parts, messages, liveness)

    def judge(self, session_id: str, reading: PartsRead, asked: Asked) -> Judgement:
        judgement = Judgement()
        for message_id, message in reading.messages.items():
            parts = [part for part in reading.parts if part.message_id == message_id]
            self._judge_message(message, parts, reading.liveness, judgement)
        return judgement

    def _gone(self, session_id: str, parts: list[OpenTool], message_id: str) -> None:
        log.info(
            "live settle of %s: message %s is gone, its parts are forgotten",
            session_id,
            message_id,
            extra={"fields": {"session": session_id, "message": message_id, "decision": "gone"}},
        )
        for part in parts:
            if part.message_id == message_id:
                self._memory.parts.pop(part.part, None)

    def _judge_message(
        self, message: Any, parts: list[OpenTool], liveness: Liveness, judgement: Judgement
    ) -> None:
        view = settle_view(message, Api.V1, liveness, single=True)
        document = view.document if view is not None else message
        changed = set() if view is None else {change.target.part for change in view.changes}
        current = {part["id"]: part for part in document["parts"]}
        holds = Holds.of(partial(_settles, message), liveness)
        for part in parts:
            part_id = part.part
            now = current.get(part_id)
            if part_id in holds.calls:
                continue  # still remembered: confirmed again once what held it back is gone
            self._memory.parts.pop(part_id, None)
            if now is not None and not is_open_tool(now, Api.V1):
                # Settled by the rules, or by the server while the stream was down: either way
                # a client that saw the part open must be told its state now.
                told = self._told(part, now, document["info"], settled_here=part_id in changed)
                judgement.told.append(told)
        if held := holds.calls & {part.part for part in parts}:
            judgement.held.append(StillHeld(holds, partial(self._any_open, parts[0].session_id, held)))

    def _any_open(self, session_id: str, parts: frozenset[str]) -> bool:
        return any(part.part in parts for part in self._memory.open_parts(session_id))

    def _told(
        self, part: OpenTool, settled_part: dict[str, Any], info: dict[str, Any], *, settled_here: bool
    ) -> Told:
        state = part_settled(part.session_id, settled_part, info)
        why = "open when the server went away; inactive in two readings"
        fields = {
            "session": part.session_id,
            "message": part.message_id,
            "part": part.part,
            "tool": settled_part.get("tool"),
            "rule": "orphaned-tool" if settled_here else None,
            "api": "v1",
            "why": why if settled_here else "settled by the server while the event stream was down",
        }
        publish = partial(
            self._clients.publish, part.part, Telling(part, state, [session_idle(part.session_id)])
        )
        if not settled_here:
            relayed = said("relayed", "relayed", "part the server settled unseen, to clients")
            return Told(relayed, fields, publish)
        return Told(
            said("settled", "would settle", "orphaned part in client streams"), fields, publish, part.part
        )


def _settles(message: Any, liveness: Liveness) -> set[str]:
    """The parts of `message` a reading settles."""
    view = settle_view(message, Api.V1, liveness, single=True)
    changes = () if view is None else view.changes
    return {change.target.part for change in changes if change.target.part is not None}
