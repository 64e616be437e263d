"""The `live-settle` addon: clients that hold state from event streams are told, too.

The TUI builds a transcript from one message fetch and then only from `/global/event`;
across a server crash it reconnects without fetching again, so a rewritten message view
never reaches it and its tool spins on. So the proxy remembers, from the stream it follows,
which v1 tool parts are open. When the stream comes back after a loss, or a session goes
idle while one of its parts is still open, it waits the grace period, confirms with a fresh
reading and a fresh read of the message that the part is orphaned, and then sends every
client event stream (`/global/event`, and `/event` of the session's directory) what the
server would have sent had it settled the part itself: `message.part.updated` with the
settled part, `message.updated` with the closed message, and `session.status` idle with
`session.idle`. Streams that connect later get the state (all but `session.idle`, which
clients take as "a turn just ended") right after they open, until the stream says
anything newer about the session (a status, a new message or part, a write-back): from
then on the replayed state could be false, and a client that connects later reads the
truth from the server itself.

A turn can also die before it calls a tool (the server killed while the model writes): the
stream showed the session busy and its assistant message unfinished, and a client keeps its
busy bar. So the proxy also remembers which sessions the stream showed busy and which assistant
messages unfinished; when the stream comes back it waits the grace period, reads each such
message afresh, takes a reading after that read, and if the session is inactive sends the
message as the rules close it (`message.updated`) and `session.status` idle, framed and
replayed as for a part.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import partial
from typing import Any, ClassVar
from urllib.parse import unquote

from aiohttp import web

from proxy.addons.context import SettleContext
from proxy.opencode.client import Credentials, UpstreamRefused
from proxy.opencode.liveness import LivenessUnknown
from proxy.opencode.tracker import GlobalEvent, StreamListener
from proxy.relay.hooks import Addon, Flow
from proxy.relay.sse import event_frame, opencode_event
from proxy.relay.tasks import KeyedTasks
from proxy.relay.upstream import opencode_path
from rules import OPEN_STATUSES, Api, Liveness, UnexpectedShape, settle_view

log = logging.getLogger(__name__)

GLOBAL_STREAM = "/global/event"
INSTANCE_STREAM = "/event"
_DIRECTORY_HEADER = "x-opencode-directory"
_IDLE_KINDS = ("session.idle", "session.error")
_REMEMBERED = 10_000
_READING_ATTEMPTS = 3


@dataclass(frozen=True, slots=True)
class OpenPart:
    """What the stream last showed open (a v1 tool part, or an assistant message), and where it lives."""

    session_id: str
    message_id: str
    directory: str | None
    project: str | None


@dataclass(slots=True)
class Subscriber:
    """One client event stream: its queue, and which events it carries."""

    queue: asyncio.Queue[bytes]
    directory: str | None
    """None: the global stream (every directory, events wrapped with their directory)."""


@dataclass(slots=True)
class Orphan:
    """A part confirmed orphaned, with the events that tell a client so.

    `state` says how things are, and is also sent to streams that connect later. `moment`
    says something just happened (`session.idle`: the web UI plays a sound and notifies), so
    it goes only to streams that were open at that moment.
    """

    part: OpenPart
    state: list[dict[str, Any]] = field(default_factory=list)
    moment: list[dict[str, Any]] = field(default_factory=list)


class LiveSettle(Addon, StreamListener):
    """Remember open parts from the followed stream; settle the orphans in client streams."""

    name: ClassVar[str] = "live-settle"

    def __init__(self, ctx: SettleContext, credentials: Credentials) -> None:
        self._ctx = ctx
        self._credentials = credentials
        self._open: OrderedDict[str, OpenPart] = OrderedDict()
        self._orphans: OrderedDict[str, dict[str, Orphan]] = OrderedDict()
        """Per session, its orphans by part id: replayed to streams that connect later."""
        self._subscribers: dict[int, Subscriber] = {}
        self._checks: KeyedTasks[str] = KeyedTasks(self.name)
        self._busy: OrderedDict[str, OpenPart] = OrderedDict()
        """Sessions the stream last showed busy (`message_id` empty), by session id."""
        self._unfinished: OrderedDict[str, OpenPart] = OrderedDict()
        """Assistant messages the stream last showed without `time.completed`, by message id."""
        self._turns: KeyedTasks[str] = KeyedTasks(f"{self.name} turns")
        self._watched: dict[str, object] = {}
        """Sessions whose turn is being confirmed; any event about one withdraws its token."""

    # What the followed stream says.

    def following(self) -> None:
        with_parts = {part.session_id for part in self._open.values()}
        for session_id in with_parts:
            self._schedule(session_id)
        for session_id in ({m.session_id for m in self._unfinished.values()} | set(self._busy)) - with_parts:
            self._turns.start(session_id, partial(self._confirm_turn, session_id))

    def event(self, event: GlobalEvent) -> None:
        if event.session_id is not None:
            self._orphans.pop(event.session_id, None)
            self._watched.pop(event.session_id, None)
        if event.kind == "message.part.updated":
            self._part_updated(event)
        elif event.kind == "message.updated":
            self._message_updated(event)
        elif event.session_id is not None and _went_idle(event):
            self._busy.pop(event.session_id, None)
            if self._has_open(event.session_id):
                self._schedule(event.session_id)
        elif event.session_id is not None and event.kind == "session.status":
            _remember(
                self._busy, event.session_id, OpenPart(event.session_id, "", event.directory, event.project)
            )

    def _has_open(self, session_id: str) -> bool:
        return any(part.session_id == session_id for part in self._open.values())

    def _part_updated(self, event: GlobalEvent) -> None:
        part = event.properties.get("part")
        if not isinstance(part, dict) or part.get("type") != "tool" or not isinstance(part.get("id"), str):
            return
        state: dict[str, Any] = part["state"] if isinstance(part.get("state"), dict) else {}
        if state.get("status") in OPEN_STATUSES[Api.V1]:
            self._open[part["id"]] = OpenPart(
                str(part.get("sessionID")), str(part.get("messageID")), event.directory, event.project
            )
            self._open.move_to_end(part["id"])
            while len(self._open) > _REMEMBERED:
                self._open.popitem(last=False)
        else:
            self._open.pop(part["id"], None)

    def _message_updated(self, event: GlobalEvent) -> None:
        info = event.properties.get("info")
        if (
            not isinstance(info, dict)
            or info.get("role") != "assistant"
            or not isinstance(info.get("id"), str)
        ):
            return
        if "completed" in (info.get("time") or {}):
            self._unfinished.pop(info["id"], None)
        else:
            place = OpenPart(str(info.get("sessionID")), info["id"], event.directory, event.project)
            _remember(self._unfinished, info["id"], place)

    # Client streams.

    async def response_headers(self, flow: Flow) -> None:
        if flow.status != 200 or flow.request.method != "GET" or not flow.event_stream:
            return
        path = opencode_path(flow.request)
        if path == GLOBAL_STREAM:
            subscriber = Subscriber(asyncio.Queue(), None)
        elif path == INSTANCE_STREAM and (directory := _requested_directory(flow.request)):
            subscriber = Subscriber(asyncio.Queue(), directory)
        else:
            return
        for orphans in self._orphans.values():
            for orphan in orphans.values():
                self._send(subscriber, orphan, live=False)
        self._subscribers[id(flow)] = subscriber
        flow.inject = subscriber.queue

    async def done(self, flow: Flow) -> None:
        self._subscribers.pop(id(flow), None)

    async def close(self) -> None:
        """Cancel pending confirmations (application cleanup)."""
        await self._checks.close()
        await self._turns.close()

    # Confirmation.

    def _schedule(self, session_id: str) -> None:
        self._checks.start(session_id, lambda: self._confirm(session_id))

    async def _confirm(self, session_id: str) -> None:
        liveness = await self._reading_after_grace(session_id)
        if liveness is None or liveness.active:
            return
        parts = [(part_id, part) for part_id, part in self._open.items() if part.session_id == session_id]
        for message_id in dict.fromkeys(part.message_id for _, part in parts):
            await self._settle_message(
                session_id, message_id, [p for p in parts if p[1].message_id == message_id], liveness
            )

    async def _reading_after_grace(self, session_id: str) -> Liveness | None:
        """A reading taken the grace period after the stream came back, asked again a few times
        (after twice, then four times the pause) while it is unknown: a server that has just
        restarted may not answer in time, and nothing else would make the proxy ask again."""
        pause = self._ctx.grace
        for attempt in range(1, _READING_ATTEMPTS + 1):
            await asyncio.sleep(pause)
            try:
                return await self._ctx.probe.read(Api.V1, session_id, self._credentials)
            except LivenessUnknown as error:
                log.info(
                    "live settle of %s: liveness unknown (%s), try %d of %d",
                    session_id,
                    error,
                    attempt,
                    _READING_ATTEMPTS,
                )
            pause *= 2
        return None

    async def _settle_message(
        self, session_id: str, message_id: str, parts: list[tuple[str, OpenPart]], liveness: Liveness
    ) -> None:
        try:
            message = await self._ctx.upstream.get(
                f"/session/{session_id}/message/{message_id}", self._credentials
            )
        except (UpstreamRefused, OSError) as error:
            log.info("live settle of %s: message %s unreadable (%s)", session_id, message_id, error)
            return
        view = settle_view(message, Api.V1, liveness, single=True)
        document = view.document if view is not None else message
        changed = set() if view is None else {_part_id(document, change.path) for change in view.changes}
        current = {part["id"]: part for part in document["parts"]}
        for part_id, part in parts:
            now = current.get(part_id)
            self._open.pop(part_id, None)
            if now is not None and now.get("state", {}).get("status") not in OPEN_STATUSES[Api.V1]:
                # Settled by the rules, or by the server while the stream was down: either way
                # a client that saw the part open must be told its state now.
                self._orphan(part_id, part, now, document["info"], settled_here=part_id in changed)

    async def _confirm_turn(self, session_id: str) -> None:
        """Close, in client streams, a turn the stream showed running and that died without a tool."""
        token = self._watched[session_id] = object()
        try:
            await self._close_turn(session_id, token)
        finally:
            if self._watched.get(session_id) is token:
                del self._watched[session_id]

    async def _close_turn(self, session_id: str, token: object) -> None:
        await asyncio.sleep(self._ctx.grace)
        if self._has_open(session_id):
            return  # the parts' own confirmation tells the whole story
        messages = [(mid, m) for mid, m in self._unfinished.items() if m.session_id == session_id]
        busy = self._busy.get(session_id)
        try:
            read = [
                (
                    place,
                    await self._ctx.upstream.get(f"/session/{session_id}/message/{mid}", self._credentials),
                )
                for mid, place in messages
            ]
            liveness = await self._ctx.probe.read(Api.V1, session_id, self._credentials)
        except (UpstreamRefused, OSError, LivenessUnknown) as error:
            log.info("live settle of turn %s postponed: %s", session_id, error)
            return
        if liveness.active:
            return
        closed = []
        for place, message in read:
            try:
                view = settle_view(message, Api.V1, liveness, single=True)
            except UnexpectedShape as error:
                log.info("live settle of turn %s: %s", session_id, error)
                return
            info = (view.document if view is not None else message)["info"]
            if "completed" not in info["time"]:
                return  # not vouched for (too fresh, or another process): leave the turn alone
            self._unfinished.pop(place.message_id, None)
            closed.append((place, info))
        if self._watched.get(session_id) is not token or not (closed or busy):
            return  # the stream spoke of the session meanwhile: it knows better
        self._busy.pop(session_id, None)
        for place, info in closed:
            self._announce(
                place, [opencode_event("message.updated", {"sessionID": session_id, "info": info})]
            )
            log.info(
                "%s unfinished message in client streams",
                "would close" if self._ctx.dry_run else "closed",
                extra={
                    "fields": {
                        "session": session_id,
                        "message": place.message_id,
                        "rule": "unfinished-message",
                        "api": "v1",
                        "why": "unfinished when the server went away; inactive in a reading taken after it",
                    }
                },
            )
        if busy is not None or closed:
            place = busy if busy is not None else closed[-1][0]
            self._announce(
                place,
                [opencode_event("session.status", {"sessionID": session_id, "status": {"type": "idle"}})],
            )

    def _announce(self, place: OpenPart, state: list[dict[str, Any]]) -> None:
        """Send `state` to every client stream now (with `session.idle` after an idle status),
        and to streams that open later until the stream says something newer about the session."""
        if self._ctx.dry_run:
            return
        idle = state[-1]["type"] == "session.status"
        moment = [opencode_event("session.idle", {"sessionID": place.session_id})] if idle else []
        orphan = Orphan(place, state, moment)
        self._orphans.setdefault(place.session_id, {})[place.message_id or "status"] = orphan
        self._orphans.move_to_end(place.session_id)
        while len(self._orphans) > _REMEMBERED:
            self._orphans.popitem(last=False)
        for subscriber in self._subscribers.values():
            self._send(subscriber, orphan, live=True)

    def _orphan(
        self,
        part_id: str,
        part: OpenPart,
        settled_part: dict[str, Any],
        info: dict[str, Any],
        *,
        settled_here: bool,
    ) -> None:
        session: dict[str, object] = {"sessionID": part.session_id}
        ended = (settled_part["state"].get("time") or {}).get("end")
        state = [
            opencode_event("message.part.updated", {**session, "part": settled_part, "time": ended}),
            opencode_event("message.updated", {**session, "info": info}),
            opencode_event("session.status", {**session, "status": {"type": "idle"}}),
        ]
        verb = "would settle" if self._ctx.dry_run else "settled"
        what = (
            "orphaned part in client streams"
            if settled_here
            else "part the server settled unseen, to clients"
        )
        why = "open when the server went away; inactive in two readings"
        log.info(
            "%s %s",
            verb if settled_here else "relayed",
            what,
            extra={
                "fields": {
                    "session": part.session_id,
                    "message": part.message_id,
                    "part": part_id,
                    "tool": settled_part.get("tool"),
                    "rule": "orphaned-tool" if settled_here else None,
                    "api": "v1",
                    "why": why if settled_here else "settled by the server while the event stream was down",
                }
            },
        )
        if self._ctx.dry_run:
            return
        orphan = Orphan(part, state, [opencode_event("session.idle", session)])
        self._orphans.setdefault(part.session_id, {})[part_id] = orphan
        self._orphans.move_to_end(part.session_id)
        while len(self._orphans) > _REMEMBERED:
            self._orphans.popitem(last=False)
        for subscriber in self._subscribers.values():
            self._send(subscriber, orphan, live=True)
        if settled_here and self._ctx.write_back is not None:
            self._ctx.write_back.schedule(Api.V1, part.session_id, self._credentials, {part_id})

    def _send(self, subscriber: Subscriber, orphan: Orphan, *, live: bool) -> None:
        part = orphan.part
        events = orphan.state + orphan.moment if live else orphan.state
        if subscriber.directory is None:
            envelope = {"directory": part.directory, **({"project": part.project} if part.project else {})}
            frames = [event_frame({**envelope, "payload": event}) for event in events]
        elif subscriber.directory == part.directory:
            frames = [event_frame(event) for event in events]
        else:
            return
        for frame in frames:
            subscriber.queue.put_nowait(frame)
        self._ctx.metrics.injected_events.inc(len(frames))


def _remember(kept: OrderedDict[str, OpenPart], key: str, place: OpenPart) -> None:
    kept[key] = place
    kept.move_to_end(key)
    while len(kept) > _REMEMBERED:
        kept.popitem(last=False)


def _went_idle(event: GlobalEvent) -> bool:
    if event.kind == "session.status":
        return (event.properties.get("status") or {}).get("type") == "idle"
    return event.kind in _IDLE_KINDS


def _requested_directory(request: web.Request) -> str | None:
    if directory := request.query.get("directory"):
        return directory
    header = request.headers.get(_DIRECTORY_HEADER)
    return unquote(header) if header else None


def _part_id(document: dict[str, Any], path: tuple[str | int, ...]) -> str | None:
    """The id of the part a change's path points at (None for the message itself)."""
    if path[:1] != ("parts",):
        return None
    part_id = document["parts"][int(path[1])].get("id")
    return part_id if isinstance(part_id, str) else None
