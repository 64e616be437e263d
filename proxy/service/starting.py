"""The collaborators that depend on the configuration, each built from values for `Assembly`: the
writer and its scheduler, who ties tool processes to their calls, and `--resume`.

The state database is opened once by each part that keeps something in it (the stream memory,
the resume ledger, the tool processes' records), not shared: the ledger claims a resume in an
explicit `BEGIN IMMEDIATE` transaction on an autocommit connection, across awaits, while the
others commit as they write; on one connection a write of theirs would land in a claim under way,
and their commit would commit it half-made (or its rollback undo their write)."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable, Mapping
from contextlib import AsyncExitStack
from pathlib import Path

import aiohttp
from prometheus_client import Counter

from proxy.addons.live.stored import Inherited, StoredMemory
from proxy.opencode.client import Credentials, UpstreamApi
from proxy.opencode.liveness import LivenessProbe
from proxy.opencode.server_line import KnownServer, ServerLine
from proxy.opencode.surveys import OtherProcesses
from proxy.resume.admission import Admission
from proxy.resume.clients_back import Clients
from proxy.resume.decision import Policy
from proxy.resume.journal import Journal
from proxy.resume.ledger import Ledger
from proxy.resume.resumer import ResumeOptions
from proxy.resume.resuming import Resuming, open_ledger
from proxy.resume.resuming import resuming as assembled_resuming
from proxy.resume.safety import Safety
from proxy.resume.text import Fates, no_fates, process_fates
from proxy.resume.waiting import Announcer
from proxy.service.config import Settings
from proxy.service.metrics import Metrics
from proxy.supervision.process_records import ProcessRecords
from proxy.supervision.stalls import Stalls, server_abort
from proxy.supervision.supervisor import Orphans, Supervisor
from proxy.supervision.tool_processes import ToolProcesses
from proxy.writeback.api_writer import ApiWriter
from proxy.writeback.database import OpencodeDatabase
from proxy.writeback.db_writer import DbWriter
from proxy.writeback.locations import Locations
from proxy.writeback.locks import SessionLocks
from proxy.writeback.modes import WriteBackMode
from proxy.writeback.scheduler import CountingWriter, ServersWrittenInto, WriteBack, Writer

__all__ = [
    "modes_said",
    "resume_ledger",
    "resuming",
    "stored_memory",
    "tool_processes",
    "write_back",
    "writer",
]

log = logging.getLogger(__name__)


async def writer(
    mode: WriteBackMode,
    where: Locations,
    upstream: UpstreamApi,
    stack: AsyncExitStack,
    write_backs: Counter,
) -> Writer | None:
    """The writer `--write-back` asks for, working `where` it is told, counted once (for the
    scheduler and the resume alike)."""
    if mode is WriteBackMode.API:
        made: Writer = ApiWriter(upstream, SessionLocks(where.lock_dir), database=where.db_path)
    elif mode is WriteBackMode.DB:
        made = DbWriter(await stack.enter_async_context(OpencodeDatabase.open(where.db_path)))
    else:
        return None
    return CountingWriter(made, write_backs)


def write_back(
    settings: Settings, probe: LivenessProbe, writer: Writer | None, line: ServerLine
) -> WriteBack | None:
    """The scheduler of write-backs through `writer`, unless there is none or this is a dry run."""
    if writer is None or settings.dry_run:
        return None
    return WriteBack(probe, writer, settings.grace, server=line)


def modes_said(settings: Settings) -> Callable[[KnownServer], None]:
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


async def tool_processes(
    state_db: Path | None, supervisor: Supervisor | None, others: OtherProcesses, stack: AsyncExitStack
) -> ToolProcesses | None:
    """Who ties tool processes to their calls: the supervisor's, for a server `run` started, or,
    for a server the proxy did not start, a watcher that finds it by the port it listens on and
    keeps its records in the state database."""
    if supervisor is not None:
        return supervisor.tool_processes
    if state_db is None:
        return None
    try:
        records = await stack.enter_async_context(ProcessRecords.open(state_db))
    except (OSError, sqlite3.Error) as error:
        log.warning("tool processes are not recorded: %s: %s", state_db, error)
        return None

    async def listening() -> int | None:
        pids = (await others.current()).upstream_pids
        return pids[0] if len(pids) == 1 else None

    watcher = ToolProcesses(listening, reports=True)
    watcher.recorder = records
    stack.push_async_callback(watcher.flush)
    return watcher


def stalls(
    settings: Settings,
    watcher: ToolProcesses | None,
    upstream: UpstreamApi,
    metrics: Metrics,
    stack: AsyncExitStack,
) -> Stalls | None:
    """Who names stalled calls, started now and stopped with `stack`; None, said once, where the
    server's tool processes are not known."""
    if watcher is None:
        log.info("stalled calls are not judged: tool processes are not recorded (no state database)")
        return None
    credentials = Credentials.configured(settings.authorization)
    abort = server_abort(upstream, credentials) if settings.stall_abort else None
    found = Stalls(
        watcher,
        after=settings.stall_after,
        abort=abort,
        aborts=lambda outcome: metrics.stall_aborts.labels(outcome).inc(),
    )
    metrics.stalled_calls.set_function(lambda: len(found.stalled))
    found.start()
    stack.push_async_callback(found.close)
    return found


async def stored_memory(
    settings: Settings, stack: AsyncExitStack
) -> tuple[StoredMemory, list[Inherited]] | None:
    """Where the stream memory is kept for the proxy that runs next on this address, and what the
    one before kept; None without a state database or a fixed port (no proxy comes back there)."""
    if settings.state_db is None or not settings.port:
        return None
    try:
        kept = await stack.enter_async_context(
            StoredMemory.open(settings.state_db, f"{settings.host}:{settings.port}")
        )
        return kept, await kept.load()
    except (OSError, sqlite3.Error) as error:
        log.warning(
            "what the event stream shows open is not kept for the proxy that runs next: %s: %s",
            settings.state_db,
            error,
        )
        return None


async def resume_ledger(settings: Settings, stack: AsyncExitStack) -> Ledger | None:
    """The ledger of resumes, where one can be kept: with `--resume`, or without it for the turns
    that wait for a person's Continue; None: nothing is resumed nor waits."""
    if not settings.resume and settings.state_db is None:
        return None
    return await open_ledger(stack, settings.state_db, asked=settings.resume)


def resuming(
    settings: Settings,
    stack: AsyncExitStack,
    *,
    ledger: Ledger | None,
    session: aiohttp.ClientSession,
    probe: LivenessProbe,
    writer: Writer | None,
    journal: Journal,
    supervisor: Supervisor | None,
    watcher: ToolProcesses | None,
    clients: Clients | None,
    line: ServerLine,
    announcer: Announcer | None = None,
) -> Resuming | None:
    """Resume, when it has its `ledger`: it assembles itself from values. Without `--resume` it
    only detects: every interrupted turn waits for a Continue. It writes only into a server the
    write-back's mode writes into, and asks a restarted server whether it is up on the route
    `line` knew it by."""
    if ledger is None:
        return None
    options = ResumeOptions(
        Policy(settings.resume_attempts, settings.resume_within),
        settings.grace,
        settings.dry_run,
        settings.resume_text,
        safety=Safety(settings.resume_safe, settings.resume_unsafe),
        auto=settings.resume,
    )
    return assembled_resuming(
        stack,
        ledger=ledger,
        session=session,
        origin=settings.upstream,
        probe=probe,
        writer=ServersWrittenInto(writer, line) if writer is not None else None,
        credentials=Credentials.configured(settings.authorization),
        health_route=line.health_route,
        journal=journal,
        options=options,
        fates=_fates(supervisor, watcher),
        clients=clients,
        admission=Admission(settings.resume_concurrency, settings.resume_spacing),
        announcer=announcer,
    )


def _fates(supervisor: Supervisor | None, watcher: ToolProcesses | None) -> Fates:
    """What the resume is told of processes, as values: under `run`, the orphans the supervisor
    adopted, its orphan policy, and the calls it tied to their processes; in front of a server the
    proxy did not start, what the records say still runs."""
    if supervisor is not None:

        async def adopted() -> Mapping[str, bool]:
            return {o.call.call: o.call_was_running for o in supervisor.orphans() if o.call is not None}

        def tied(call: str) -> bool:
            return supervisor.subreaper and supervisor.tool_processes.tied(call)

        ending = supervisor.health()["orphans"] == Orphans.TERMINATE
        return process_fates(adopted, ending=ending, tied=tied)
    if watcher is not None:

        async def left() -> Mapping[str, bool]:
            return {o.call.call: False for o in await watcher.left_running() if o.call is not None}

        return process_fates(left)
    return no_fates
