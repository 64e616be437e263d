"""The aiohttp application: the proxy's own routes, the catch-all forwarder, and what they own."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack

from aiohttp import web

from proxy.addons.context import SettleContext
from proxy.addons.live import LiveSettle
from proxy.addons.routing import Routing, event_stream, message_view
from proxy.addons.session_streams import SessionStreamSettle
from proxy.addons.settle import Settle
from proxy.opencode.client import Credentials, UpstreamApi
from proxy.opencode.liveness import LivenessProbe
from proxy.opencode.other_processes import mark_this_process
from proxy.opencode.server_line import SERVER_LINE, KnownServer, ServerLine
from proxy.opencode.surveys import OTHER_PROCESSES, OtherProcesses
from proxy.opencode.tracker import TRACKER, LivenessTracker
from proxy.relay.departures import DEPARTURES, Departures
from proxy.relay.forward import Forwarder
from proxy.relay.headers import MountedLinks, drop_invented_headers
from proxy.relay.hooks import Addon, Addons, Scope
from proxy.relay.options import RELAY, RELAY_METRICS, RelayOptions
from proxy.relay.tasks import BACKGROUND, Background
from proxy.relay.upstream import MOUNT_PREFIX, UPSTREAM, upstream_session
from proxy.resume.clients import ClientStreams
from proxy.resume.journal import JOURNAL, Journal
from proxy.service import health
from proxy.service.auth import DETAILS_GUARD, require_basic_auth
from proxy.service.config import SETTINGS, Settings
from proxy.service.metrics import METRICS, Metrics
from proxy.service.resuming import start_resume
from proxy.supervision.process_records import ProcessRecords
from proxy.supervision.supervisor import SUPERVISOR
from proxy.supervision.tool_processes import TOOL_PROCESSES, ToolProcesses
from proxy.writeback.api_writer import ApiWriter
from proxy.writeback.database import OpencodeDatabase, default_path
from proxy.writeback.db_writer import DbWriter
from proxy.writeback.locks import SessionLocks, default_lock_dir
from proxy.writeback.scheduler import CountingWriter, WriteBack, WriteBackMode, Writer

WRITE_BACK = web.AppKey("write_back", WriteBack)
log = logging.getLogger(__name__)


async def _writer(settings: Settings, upstream: UpstreamApi, stack: AsyncExitStack) -> Writer | None:
    if settings.write_back is WriteBackMode.API:
        return ApiWriter(upstream, SessionLocks(settings.lock_dir or default_lock_dir(os.environ)))
    if settings.write_back is WriteBackMode.DB:
        database = await stack.enter_async_context(
            OpencodeDatabase.open(settings.db_path or default_path(os.environ))
        )
        return DbWriter(database)
    return None


async def _addons(forwarder: Forwarder, app: web.Application) -> AsyncIterator[None]:
    """`cleanup_ctx` entry: the addons a stand-alone proxy runs, and what they own; `forwarder`
    is given them, with the upstream session."""
    settings, metrics = app[SETTINGS], app[METRICS]
    upstream = UpstreamApi(app[UPSTREAM], settings.upstream)
    mark_this_process()
    elsewhere = app[OTHER_PROCESSES] = OtherProcesses(settings.upstream)
    probe = LivenessProbe(
        upstream,
        authorization=settings.authorization,
        timeout=settings.liveness_timeout,
        elsewhere=elsewhere,
        lookups=metrics.liveness_requests,
    )
    line = app[SERVER_LINE] = ServerLine(upstream, Credentials.configured(settings.authorization))
    background = app[BACKGROUND] = Background()
    metrics.background_busy.set_function(lambda: float(background.busy))
    background.add(elsewhere)
    async with AsyncExitStack() as stack:
        stack.push_async_callback(elsewhere.close)
        _asked_again_after_each_exit(app, line, stack)
        writer = await _writer(settings, upstream, stack)
        write_back = _write_back(app, probe, writer, stack)
        line.listeners.append(_what_each_mode_does(settings))
        tracker = app[TRACKER] = LivenessTracker(
            app[UPSTREAM],
            settings.upstream,
            authorization=settings.authorization,
            connect_timeout=settings.connect_timeout,
            clock=probe.clock,
            metrics=metrics.stream,
            server=line,
        )
        ctx = SettleContext(
            probe,
            upstream,
            metrics,
            settings.grace,
            Credentials.configured(settings.authorization),
            write_back,
            settings.dry_run,
        )
        clients = _dispatch(app, forwarder, ctx, tracker, stack)
        if DETAILS_GUARD in app:
            tracker.listeners.append(app[DETAILS_GUARD])
        if (watcher := await _tool_processes(app, stack)) is not None:
            tracker.listeners.append(watcher)
        if settings.resume:
            await start_resume(
                app,
                stack,
                probe=probe,
                writer=writer,
                tracker=tracker,
                background=background,
                clients=clients,
            )
        following = asyncio.create_task(tracker.run(), name="liveness-tracker")
        stack.push_async_callback(_cancelled, following)
        yield


def _asked_again_after_each_exit(app: web.Application, line: ServerLine, stack: AsyncExitStack) -> None:
    """Under `run`, which server this is is asked again each time the server exits: one whose
    stream is not followed says by no lost stream that it restarted, perhaps as another version."""
    if (supervisor := app.get(SUPERVISOR)) is not None:
        supervisor.exited.append(line.forget)
        stack.callback(supervisor.exited.remove, line.forget)


def _write_back(
    app: web.Application, probe: LivenessProbe, writer: Writer | None, stack: AsyncExitStack
) -> WriteBack | None:
    """The scheduler of write-backs through `writer`, unless there is none or this is a dry run."""
    settings = app[SETTINGS]
    if writer is None or settings.dry_run:
        return None
    write_back = app[WRITE_BACK] = WriteBack(
        probe, CountingWriter(writer, app[METRICS].write_backs), settings.grace, server=app[SERVER_LINE]
    )
    stack.push_async_callback(write_back.close)
    app[BACKGROUND].add(write_back.tasks)
    return write_back


def _what_each_mode_does(settings: Settings) -> Callable[[KnownServer], None]:
    """What says, once per server that becomes known, what the modes asked for do not do on it."""
    writer = str(settings.write_back) if settings.write_back is not WriteBackMode.OFF else None
    asked = [writer] if writer is not None else []
    asked += ["resume"] if settings.resume else []

    def say(server: KnownServer) -> None:
        for mode in asked:
            if (refused := server.refusal(mode, writer=writer)) is not None:
                flag = "--resume" if mode == "resume" else f"--write-back {mode}"
                fields = server.describe() | {"mode": mode, "why": refused}
                log.warning(
                    "%s does nothing on opencode %s: %s",
                    flag,
                    server.version,
                    refused,
                    extra={"fields": fields},
                )

    return say


def _dispatch(
    app: web.Application,
    forwarder: Forwarder,
    ctx: SettleContext,
    tracker: LivenessTracker,
    stack: AsyncExitStack,
) -> ClientStreams | None:
    """The addons, given to `forwarder` in order and to `tracker` if they follow the stream; the
    client streams a resume waits for, if `--resume` is on."""
    prefix = app.get(MOUNT_PREFIX, "")
    live, streams = LiveSettle(ctx, server=app[SERVER_LINE]), SessionStreamSettle(ctx)
    clients = ClientStreams() if app[SETTINGS].resume else None
    settle = Settle(ctx, tracker=tracker, server=app[SERVER_LINE])
    addons, scopes = _in_order(settle, live, streams, clients, prefix)
    dispatcher = Addons(addons, app[METRICS].addon_errors, scopes=scopes)
    forwarder.start(dispatcher, prefix=prefix)
    stack.push_async_callback(forwarder.close)
    stack.push_async_callback(dispatcher.close)
    tracker.listeners.extend((live, streams))
    app[BACKGROUND].add(live.tasks)
    app[BACKGROUND].add(streams.tasks)
    return clients


def _in_order(
    settle: Settle,
    live: LiveSettle,
    streams: SessionStreamSettle,
    clients: ClientStreams | None,
    prefix: str,
) -> tuple[list[Addon], dict[Addon, Scope]]:
    """The addons in the order their hooks run, and the routes each acts on: a route none acts on
    runs `routing` alone, with no other hook and no snapshot."""
    addons: list[Addon] = [Routing(), settle, live, streams]
    scopes: dict[Addon, Scope] = {settle: message_view, live: event_stream, streams: event_stream}
    if clients is not None:
        addons.append(clients)
        scopes[clients] = event_stream
    if prefix:
        addons.insert(0, MountedLinks(prefix))
    return addons, scopes


async def _tool_processes(app: web.Application, stack: AsyncExitStack) -> ToolProcesses | None:
    """Who ties tool processes to their calls: the supervisor of a server `run` started, or, for a
    server the proxy did not start, a watcher that finds it by the port it listens on and keeps its
    records in the state database."""
    if (supervisor := app.get(SUPERVISOR)) is not None:
        app[METRICS].orphans.set_function(lambda: len(supervisor.orphans()))
        return supervisor.tool_processes
    path = app[SETTINGS].state_db
    if path is None:
        return None
    try:
        records = await stack.enter_async_context(ProcessRecords.open(path))
    except (OSError, sqlite3.Error) as error:
        log.warning("tool processes are not recorded: %s: %s", path, error)
        return None
    others = app[OTHER_PROCESSES]

    async def listening() -> int | None:
        pids = (await others.current()).upstream_pids
        return pids[0] if len(pids) == 1 else None

    watcher = app[TOOL_PROCESSES] = ToolProcesses(listening, reports=True)
    watcher.recorder = records
    stack.push_async_callback(watcher.flush)
    return watcher


async def _cancelled(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def create_app(settings: Settings) -> web.Application:
    """Build the proxy application for `settings`; run it with `aiohttp.web` as usual.

    To embed settlement in an existing aiohttp application, use `mount` instead.
    """
    app = web.Application(middlewares=[require_basic_auth(*settings.auth)] if settings.auth else [])
    app[SETTINGS] = settings
    metrics = app[METRICS] = Metrics()
    app[RELAY] = RelayOptions(
        settings.upstream_origin, settings.connect_timeout, settings.response_timeout, settings.max_body
    )
    app[DEPARTURES] = departures = Departures()
    relay_metrics = app[RELAY_METRICS] = metrics.relay
    forwarder = Forwarder(app[RELAY], relay_metrics, departures)
    app.cleanup_ctx.extend((upstream_session, functools.partial(_addons, forwarder)))
    app.on_response_prepare.append(drop_invented_headers)
    app.on_shutdown.append(forwarder.streams.cut)
    app[JOURNAL] = Journal(metrics.registry, enabled=settings.resume, dry_run=settings.dry_run)
    health.add_routes(app)
    # (?s): a path may hold an encoded line break, and the upstream must answer for it, not us.
    app.router.add_route("*", "/{tail:(?s:.*)}", forwarder.forward)
    return app


def mount(parent: web.Application, prefix: str, settings: Settings) -> web.Application:
    """Serve the proxy under `prefix` of an existing application (e.g. "/opencode").

    Requests below the prefix reach the upstream without it; the proxy's lifecycle
    (upstream connections, write-back) follows the parent's start-up and cleanup.
    """
    prefix = "/" + prefix.strip("/")
    app = create_app(settings)
    app[MOUNT_PREFIX] = prefix
    parent.add_subapp(prefix, app)
    return app
