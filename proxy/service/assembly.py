"""The application's parts, built once as it starts, in one `AsyncExitStack`, each handed only the
values it uses, and kept in one record (`Started`); and the one registration that wires each part
from what it declares (`wire`).

Adding an addon is one new module in `proxy/addons/` and one line in `ADDONS`: its scope, its
background `tasks` (every addon is `Working`), its `close` and whether it follows the server's
stream (a `StreamListener`) are its own to say, and the registration wires its hooks, its
listener, its work and its shutdown from that, in the order given. The parts others are given
(the live feature, the resume's clients) are built by name where they are used, never found
among the built addons by their type.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from prometheus_client import Counter

from proxy.addons.context import SettleContext
from proxy.addons.live.addon import LiveSettle
from proxy.addons.live.notices import Notices
from proxy.addons.live.resume_clients import ResumeClients
from proxy.addons.live.session_streams import SessionStreamSettle
from proxy.addons.mounted_links import MountedLinks
from proxy.addons.routing import Routing
from proxy.addons.settle import Settle
from proxy.opencode.client import Credentials, UpstreamApi
from proxy.opencode.liveness import LivenessProbe
from proxy.opencode.other_processes import mark_this_process
from proxy.opencode.server_line import ServerLine
from proxy.opencode.surveys import OtherProcesses
from proxy.opencode.tracker import LivenessTracker, StreamListener
from proxy.relay.departures import Departures
from proxy.relay.forward import Around, Forwarder
from proxy.relay.hooks import Addon, Addons
from proxy.relay.options import RelayOptions
from proxy.relay.stopping import OpenStreams
from proxy.relay.tasks import Background, Working
from proxy.relay.transport import Transport
from proxy.relay.upstream import upstream_session
from proxy.resume.journal import Journal
from proxy.resume.resuming import Resuming
from proxy.resume.waiting import Announcer
from proxy.service.config import Settings
from proxy.service.metrics import Metrics
from proxy.service.settle_routes import SettleRoutes
from proxy.service.starting import (
    modes_said,
    resume_ledger,
    resuming,
    stalls,
    stored_memory,
    tool_processes,
    write_back,
    writer,
)
from proxy.supervision.stalls import Stalls
from proxy.supervision.supervisor import Supervisor
from proxy.supervision.tool_processes import ToolProcesses
from proxy.writeback.locations import Locations
from proxy.writeback.scheduler import WriteBack, Writer

__all__ = ["ADDONS", "AddonFactory", "Assembly", "Built", "Started", "wire"]


@dataclass(frozen=True, slots=True)
class Built:
    """What an addon is built from: the collaborators assembled before the addons."""

    settings: Settings
    ctx: SettleContext
    tracker: LivenessTracker
    line: ServerLine
    prefix: str
    live: LiveSettle
    """The live feature, built before the addons: the resume tells a person through its notices,
    and the kept memory is its. Its factory in `ADDONS` places its hooks among the others'."""


AddonFactory = Callable[[Built], Addon | None]
"""One addon of the application, built from what it uses (None: not in this configuration)."""

ADDONS: tuple[AddonFactory, ...] = (
    lambda built: MountedLinks(built.prefix) if built.prefix else None,
    lambda built: Routing(built.prefix, line=built.line),
    lambda built: Settle(built.ctx, tracker=built.tracker, server=built.line),
    lambda built: built.live,
    lambda built: SessionStreamSettle(built.ctx),
)
"""The addons, in the order their hooks run (and their listeners hear the stream); the resume's
`ResumeClients` and the live feature's notices run after them."""

Part = Addon | StreamListener
"""What the application is made of: an addon (a `StreamListener` too if it follows the stream),
or a listener of the stream alone (the details guard, the tool-process watcher, the resume, which
works in the background too: a `Working` part)."""


def wire(
    parts: Sequence[Part | None],
    *,
    tracker: LivenessTracker,
    background: Background,
    errors: Counter,
    stack: AsyncExitStack,
) -> Addons:
    """The one registration: each part, in order, as what it declares. An addon's hooks go to the
    dispatcher returned (which closes them, the last first, with `stack`); a `StreamListener`
    hears the followed stream; a `Working` part's `tasks` are waited for by `background`."""
    present = [part for part in parts if part is not None]
    for part in present:
        if isinstance(part, StreamListener):
            tracker.listeners.append(part)
        if isinstance(part, Working) and part.tasks is not None:
            background.add(part.tasks)
    addons = Addons([part for part in present if isinstance(part, Addon)], errors)
    stack.push_async_callback(addons.close)
    return addons


@dataclass(frozen=True, slots=True)
class Started:
    """The parts built as the application starts, once, in one place (`Assembly._assemble`): the
    record the handlers and the `/_settle` routes read, never changed after."""

    session: aiohttp.ClientSession
    line: ServerLine
    others: OtherProcesses
    tracker: LivenessTracker
    forwarder: Forwarder
    journal: Journal
    """Every resume decision; enabled when `--resume` keeps its ledger."""
    resuming: Resuming | None
    write_back: WriteBack | None
    tool_processes: ToolProcesses | None
    notices: Notices
    """Tells the client streams that a turn waits for a person: the resume's Announcer unless the
    application gives one."""
    stalls: Stalls | None = None
    """Names stalled calls (None: the server's tool processes are not known here)."""


class Assembly:
    """Everything the application runs, built once: what needs no running loop when the
    application is made, the rest as it starts (`run`, its `cleanup_ctx` entry: the `started`
    record), closed with it. The application's handlers are this object's, so none looks
    anything up in the app."""

    def __init__(
        self,
        settings: Settings,
        *,
        addons: Sequence[AddonFactory] = ADDONS,
        supervisor: Supervisor | None = None,
        prefix: str = "",
        where: Locations,
        announcer: Announcer | None = None,
    ) -> None:
        self.settings = settings
        self.announcer = announcer
        """Who tells a person of a turn that waits for them (None: only the log and `/_settle/resume`)."""
        self.supervisor = supervisor
        self.prefix = prefix
        self.metrics = metrics = Metrics()
        self.streams = OpenStreams()
        self.departures = Departures()
        self.background = background = Background()
        metrics.background_busy.set_function(lambda: float(background.busy))
        if supervisor is not None:
            metrics.orphans.set_function(lambda: len(supervisor.orphans()))
        self.routes = SettleRoutes(settings, metrics, lambda: self.started, supervisor=supervisor)
        """The proxy's own `/_settle` routes; their details guard hears the stream too."""
        self._addons = addons
        self.where = where
        """Where the write-back works, every location resolved."""
        self._started: Started | None = None

    @property
    def started(self) -> Started:
        """The parts built as the application started (an error before it has)."""
        if self._started is None:
            raise RuntimeError("the proxy's parts are built as its application starts, and it has not")
        return self._started

    @property
    def write_back(self) -> WriteBack | None:
        """The write-back's scheduler: an embedding application may await its `settled`."""
        return self.started.write_back

    @property
    def notices(self) -> Notices:
        """What tells a person, in their clients, of a turn that waits for them (an embedding
        application's resume may announce with it)."""
        return self.started.notices

    async def run(self, _: web.Application) -> AsyncIterator[None]:
        """`cleanup_ctx` entry: build the parts, in one stack, and close them in reverse."""
        async with AsyncExitStack() as stack:
            started = self._started = await self._assemble(stack)
            following = asyncio.create_task(started.tracker.run(), name="liveness-tracker")
            stack.push_async_callback(_cancelled, following)
            yield

    async def forward(self, request: web.Request) -> web.StreamResponse:
        """The catch-all handler: the forwarder built at start-up."""
        return await self.started.forwarder.forward(request)

    async def _assemble(self, stack: AsyncExitStack) -> Started:
        settings, metrics = self.settings, self.metrics
        session = await stack.enter_async_context(upstream_session(settings.connect_timeout))
        line = self._server_line(session, stack)
        upstream = UpstreamApi(session, settings.upstream, user=line.user)
        others = self._others(stack)
        probe = self._liveness(upstream, others)
        written = await writer(settings.write_back, self.where, upstream, stack, metrics.write_backs)
        scheduled = write_back(settings, probe, written, line)
        if scheduled is not None:
            stack.push_async_callback(scheduled.close)
            self.background.add(scheduled.tasks)
        tracker = LivenessTracker(
            session,
            settings.upstream,
            authorization=settings.authorization,
            connect_timeout=settings.connect_timeout,
            clock=probe.clock,
            metrics=metrics.stream,
            server=line,
        )
        credentials = Credentials.configured(settings.authorization)
        ctx = SettleContext(
            probe, upstream, metrics, settings.grace, credentials, scheduled, settings.dry_run
        )
        live = LiveSettle(ctx, server=line)
        built = Built(settings, ctx, tracker, line, self.prefix, live)
        addons = [factory(built) for factory in self._addons]
        watcher = await tool_processes(settings.state_db, self.supervisor, others, stack)
        clients = ResumeClients() if settings.resume else None
        if (kept := await stored_memory(settings, stack)) is not None:
            live.remember(*kept)
            self.background.add(kept[0])
        announcer = self.announcer if self.announcer is not None else live.notices
        journal, resumed = await self._resume(
            stack, session, probe, written, watcher=watcher, clients=clients, line=line, announcer=announcer
        )
        stalled = stalls(settings, watcher, upstream, metrics, stack)
        parts = [*addons, clients, live.notices, self.routes.guard, watcher, stalled, resumed]
        dispatcher = wire(
            parts, tracker=tracker, background=self.background, errors=metrics.addon_errors, stack=stack
        )
        forwarder = self._forwarder(dispatcher, session, stack)
        found = (journal, resumed, scheduled, watcher, live.notices, stalled)
        return Started(session, line, others, tracker, forwarder, *found)

    async def _resume(
        self,
        stack: AsyncExitStack,
        session: aiohttp.ClientSession,
        probe: LivenessProbe,
        written: Writer | None,
        *,
        watcher: ToolProcesses | None,
        clients: ResumeClients | None,
        line: ServerLine,
        announcer: Announcer,
    ) -> tuple[Journal, Resuming | None]:
        """The journal of resume decisions, and the resume, once it has its ledger (its waiting
        turns loaded), or None: nothing is resumed nor waits."""
        settings = self.settings
        ledger = await resume_ledger(settings, stack)
        enabled = settings.resume and ledger is not None
        journal = Journal(self.metrics.registry, enabled=enabled, dry_run=settings.dry_run)
        resumed = resuming(
            settings,
            stack,
            ledger=ledger,
            session=session,
            probe=probe,
            writer=written,
            journal=journal,
            supervisor=self.supervisor,
            watcher=watcher,
            clients=clients,
            line=line,
            announcer=announcer,
        )
        if resumed is not None:
            await resumed.waiting.load()
        return journal, resumed

    def _others(self, stack: AsyncExitStack) -> OtherProcesses:
        """The other processes on the upstream's database, this one marked as the proxy first."""
        mark_this_process()
        others = OtherProcesses(self.settings.upstream)
        self.background.add(others)
        stack.push_async_callback(others.close)
        return others

    def _liveness(self, upstream: UpstreamApi, others: OtherProcesses) -> LivenessProbe:
        """Where liveness is asked, bounded by the other processes on the database."""
        settings = self.settings
        return LivenessProbe(
            upstream,
            authorization=settings.authorization,
            timeout=settings.liveness_timeout,
            elsewhere=others,
            lookups=self.metrics.liveness_requests,
        )

    def _server_line(self, session: aiohttp.ClientSession, stack: AsyncExitStack) -> ServerLine:
        """Which server the upstream is, asked on its own client (each route as the user of the
        line it belongs to), and asked again, under `run`, each time the server exits; quiet
        while the supervised server is not up."""
        settings = self.settings
        supervisor = self.supervisor
        absent = supervisor.absent if supervisor is not None else (lambda: False)
        credentials = Credentials.configured(settings.authorization)
        line = ServerLine(UpstreamApi(session, settings.upstream), credentials, absent=absent)
        line.listeners.append(modes_said(settings))
        if supervisor is not None:
            supervisor.exited.append(line.forget)
            stack.callback(supervisor.exited.remove, line.forget)
        return line

    def _forwarder(self, addons: Addons, session: aiohttp.ClientSession, stack: AsyncExitStack) -> Forwarder:
        """The catch-all handler's forwarder, and its transport (closed with `stack`)."""
        settings = self.settings
        relay = RelayOptions(
            settings.upstream_origin, settings.connect_timeout, settings.response_timeout, settings.max_body
        )
        transport = Transport(relay.upstream_origin, relay.connect_timeout)
        stack.push_async_callback(transport.close)
        around = Around(self.departures, self.streams, session)
        return Forwarder(relay, self.metrics.relay, transport, addons, around, prefix=self.prefix)


async def _cancelled(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
