"""The `live-settle` addon: clients that hold state from event streams are told, too.

The TUI builds a transcript from one message fetch and then only from `/global/event`;
across a server crash it reconnects without fetching again, so a rewritten message view
never reaches it and its tool spins on. So the proxy remembers, from the stream it follows,
which v1 tool parts are open (`memory`). When the stream comes back after a loss, or a
session goes idle while one of its parts is still open, it waits the grace period, confirms
with a fresh reading and a fresh read of the message that the part is orphaned
(`parts`), and then sends every client event stream (`/global/event`, and `/event` of
the session's directory) what the server would have sent had it settled the part itself:
`message.part.updated` with the settled part, `message.updated` with the closed message, and
`session.status` idle with `session.idle`. Streams that connect later get the state (all but
`session.idle`, which clients take as "a turn just ended") right after they open, each thing
(a part, a message, the status) until the stream says something newer of that same thing: from
then on its replayed state could be false (`replay`). The server's write-back of a replayed
part (it settled, as replayed) agrees, and is replayed in its place; so is a user message the
server announces afterwards (a resume's prompt), which a client back too late missed.

A turn can also die before it calls a tool (the server killed while the model writes): the
stream showed the session busy and its assistant message unfinished, and a client keeps its
busy bar. So the proxy also remembers which sessions the stream showed busy and which assistant
messages unfinished; when the stream comes back it waits the grace period, reads each such
message afresh, takes a reading after that read, and if the session is inactive sends the
message as the rules close it (`message.updated`) and `session.status` idle, framed and
replayed as for a part (`turns`).

On 2.x the stream followed is `/api/event`, and its calls are confirmed and told to the clients
of `/api/event` in 2.x's shape (`calls`).

A plain `/event` (no directory asked, as the official SDK's default client subscribes) is the
stream of the server's default directory, which the proxy asks the server for each time the
followed stream (re)connects (`default_directory`).

Whatever the proxy settles it tells completely, whichever process of it saw the call start: a
view another client's fetch settled (`SettledViews`), or a part the server announces settled as
interrupted that this process never saw open (a write-back after the proxy itself crashed and a
new one started), is confirmed and told as if the stream had shown it open, unless the session
was told idle since. A confirmation another holder of the database held back is made again once
that process exits (`held`).
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import ClassVar

from proxy.addons.context import SettleContext
from proxy.addons.live.calls import OpenCalls
from proxy.addons.live.clients import ClientStreams
from proxy.addons.live.default_directory import DefaultDirectory
from proxy.addons.live.memory import Keeper, StreamMemory
from proxy.addons.live.notices import Notices
from proxy.addons.live.parts import OpenParts
from proxy.addons.live.stored import Inherited
from proxy.addons.live.turns import DeadTurns
from proxy.addons.routing import event_stream
from proxy.opencode.server_line import TOLD_1_18, ServerLine
from proxy.opencode.tracker import FollowedEvent, StreamListener
from proxy.relay.hooks import Addon, Flow
from proxy.relay.tasks import Together
from rules import Api, OpenTool, Target

log = logging.getLogger(__name__)


class LiveSettle(Addon, StreamListener):
    """Remember open parts from the followed stream; settle the orphans in client streams."""

    name: ClassVar[str] = "live-settle"

    def __init__(self, ctx: SettleContext, *, server: ServerLine | None = None) -> None:
        """`server` says which server the upstream is (given none, it is told 1.18.33)."""
        self.scope = event_stream
        self._ctx = ctx
        self._memory = StreamMemory()
        self._clients = ClientStreams(ctx.metrics.injected_events)
        server = server or ServerLine.told(TOLD_1_18)
        self._default = DefaultDirectory(ctx.upstream, server, self._clients.learned_default)
        self._parts = OpenParts(ctx, self._memory, self._clients)
        self._turns = DeadTurns(ctx, self._memory, self._clients)
        ctx.views.listeners.append(self._view_settled)
        self._calls = OpenCalls(ctx, self._memory, self._clients, server)
        self.notices = Notices(ctx, self._clients)
        """What a resume announces a turn that waits for a person with (`notices`), an
        addon of its own (the assembly wires it)."""
        self._followed = False
        self.tasks: Together = Together(
            self._default, self._parts.tasks, self._turns.tasks, self._calls.tasks
        )

    def remember(self, keeper: Keeper, kept: list[Inherited]) -> None:
        """Keep the memory through `keeper` from now on, holding first what it `kept` of the proxy
        before: confirmed, once the server's stream is followed, as after a loss of that stream."""
        for thing in kept:
            self._memory.restore(thing.kind, thing.key, thing.place)
        self._memory.kept_by(keeper)
        if kept:
            self._followed = True
            counts = Counter(thing.kind for thing in kept)
            log.info(
                "kept by the proxy that ran before: %d open parts, %d busy sessions, %d unfinished "
                "messages, %d open calls; each confirmed once the server's stream is followed",
                counts["part"],
                counts["session"],
                counts["message"],
                counts["call"],
                extra={"fields": dict(counts) | {"decision": "confirm what was kept"}},
            )

    # What the followed stream says.

    def following(self) -> None:
        self._clients.lost = self._followed
        self._followed = True
        self._clients.default_directory = None  # a restarted server may run elsewhere: ask again
        self._default.learn(self._ctx.credentials)
        with_parts = self._memory.sessions_with_parts()
        for session_id in with_parts:
            self._parts.schedule(session_id)
        for session_id in self._memory.sessions_with_turns() - with_parts:
            self._turns.schedule(session_id)
        self._calls.following()

    def event(self, event: FollowedEvent) -> None:
        self._clients.heard(event)
        self._parts.heard(event)
        self._turns.heard(event)
        self._calls.heard(event)
        if (idle := self._memory.observe(event)) is not None:
            self._parts.schedule(idle)

    def _view_settled(self, api: Api, session_id: str, targets: frozenset[Target]) -> None:
        """A client's fetch settled a v1 view (`SettledViews`): a client stream that kept its state
        from before (the TUI after the proxy itself crashed) must be told, unless the session's
        parts are being confirmed or it was told idle since. Its parts are confirmed as if the
        stream had shown them open, a message alone as a turn cut before any tool."""
        if (
            api is not Api.V1
            or self._memory.has_open(session_id)
            or self._clients.replays.told_idle(session_id)
        ):
            return
        parts = [target for target in targets if target.part is not None]
        log.info(
            "view of %s settled for a client: confirmed for the client streams, which may hold it open",
            session_id,
            extra={"fields": {"session": session_id, "parts": len(parts), "decision": "confirm for streams"}},
        )
        for target in parts:
            self._memory.parts[str(target.part)] = OpenTool(
                Api.V1, session_id, target.message, str(target.part), target.tool
            )
        if parts:
            self._parts.schedule(session_id)
        else:
            self._turns.view_settled(session_id, sorted({target.message for target in targets}))

    # Client streams.

    async def response_headers(self, flow: Flow) -> None:
        subscriber = self._clients.subscribe(flow, by=self.name)
        if (
            subscriber is None
            or subscriber.directory is not None
            or subscriber.everywhere
            or subscriber.line_2x
        ):
            return
        if not self._default.busy:  # the proxy's attempts gave up: try the client's credentials
            self._default.learn(self._ctx.probe.credentials(flow.request))

    async def done(self, flow: Flow) -> None:
        self._clients.unsubscribe(flow)

    async def close(self) -> None:
        """Cancel pending confirmations and the question of the default directory (application
        cleanup)."""
        await self.tasks.close()
