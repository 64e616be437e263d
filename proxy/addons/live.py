"""The `live-settle` addon: clients that hold state from event streams are told, too.

The TUI builds a transcript from one message fetch and then only from `/global/event`;
across a server crash it reconnects without fetching again, so a rewritten message view
never reaches it and its tool spins on. So the proxy remembers, from the stream it follows,
which v1 tool parts are open (`live_memory`). When the stream comes back after a loss, or a
session goes idle while one of its parts is still open, it waits the grace period, confirms
with a fresh reading and a fresh read of the message that the part is orphaned
(`live_parts`), and then sends every client event stream (`/global/event`, and `/event` of
the session's directory) what the server would have sent had it settled the part itself:
`message.part.updated` with the settled part, `message.updated` with the closed message, and
`session.status` idle with `session.idle`. Streams that connect later get the state (all but
`session.idle`, which clients take as "a turn just ended") right after they open, each thing
(a part, a message, the status) until the stream says something newer of that same thing: from
then on its replayed state could be false (`live_replay`). The server's write-back of a replayed
part (it settled, as replayed) agrees, and is replayed in its place; so is a user message the
server announces afterwards (a resume's prompt), which a client back too late missed.

A turn can also die before it calls a tool (the server killed while the model writes): the
stream showed the session busy and its assistant message unfinished, and a client keeps its
busy bar. So the proxy also remembers which sessions the stream showed busy and which assistant
messages unfinished; when the stream comes back it waits the grace period, reads each such
message afresh, takes a reading after that read, and if the session is inactive sends the
message as the rules close it (`message.updated`) and `session.status` idle, framed and
replayed as for a part (`live_turns`).

On 2.x the stream followed is `/api/event`, and its calls are confirmed and told to the clients
of `/api/event` in 2.x's shape (`live_calls`).

A plain `/event` (no directory asked, as the official SDK's default client subscribes) is the
stream of the server's default directory, which the proxy asks the server for each time the
followed stream (re)connects (`live_default`).
"""

from __future__ import annotations

from typing import ClassVar

from proxy.addons.context import SettleContext
from proxy.addons.live_calls import OpenCalls
from proxy.addons.live_clients import ClientStreams
from proxy.addons.live_default import DefaultDirectory
from proxy.addons.live_memory import StreamMemory
from proxy.addons.live_notices import Notices
from proxy.addons.live_parts import OpenParts
from proxy.addons.live_turns import DeadTurns
from proxy.addons.routing import event_stream
from proxy.opencode.server_line import TOLD_1_18, ServerLine
from proxy.opencode.tracker import GlobalEvent, StreamListener
from proxy.relay.hooks import Addon, Flow
from proxy.relay.tasks import Together


class LiveSettle(Addon, StreamListener):
    """Remember open parts from the followed stream; settle the orphans in client streams."""

    name: ClassVar[str] = "live-settle"

    def __init__(self, ctx: SettleContext, *, server: ServerLine | None = None) -> None:
        """`server` says which server the upstream is (given none, it is told 1.18.33)."""
        self.scope = event_stream
        self._ctx = ctx
        self._memory = StreamMemory()
        self._clients = ClientStreams(ctx.metrics.injected_events)
        self._default = DefaultDirectory(ctx.upstream, self._clients.learned_default)
        self._parts = OpenParts(ctx, self._memory, self._clients)
        self._turns = DeadTurns(ctx, self._memory, self._clients)
        self._calls = OpenCalls(ctx, self._clients, server or ServerLine.told(TOLD_1_18))
        self.notices = Notices(ctx, self._clients)
        """What a resume announces a turn that waits for a person with (`live_notices`), an
        addon of its own (the assembly wires it)."""
        self._followed = False
        self.tasks: Together = Together(
            self._default, self._parts.tasks, self._turns.tasks, self._calls.tasks
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

    def event(self, event: GlobalEvent) -> None:
        self._clients.heard(event)
        self._parts.heard(event)
        self._turns.heard(event)
        self._calls.heard(event)
        if (idle := self._memory.observe(event)) is not None:
            self._parts.schedule(idle)

    # Client streams.

    async def response_headers(self, flow: Flow) -> None:
        subscriber = self._clients.subscribe(flow, by=self.name)
        if subscriber is None or subscriber.directory is not None or subscriber.everywhere or subscriber.api:
            return
        if not self._default.busy:  # the proxy's attempts gave up: try the client's credentials
            self._default.learn(self._ctx.probe.credentials(flow.request))

    async def done(self, flow: Flow) -> None:
        self._clients.unsubscribe(flow)

    async def close(self) -> None:
        """Cancel pending confirmations and the question of the default directory (application
        cleanup)."""
        await self.tasks.close()
