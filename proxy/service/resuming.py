"""Wiring `--resume` into the application: its options, the write-back it settles through, and
what the supervisor (or the tool-process watcher) knows of the interrupted calls' processes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack

from aiohttp import web

from proxy.opencode.client import Credentials
from proxy.opencode.liveness import LivenessProbe
from proxy.opencode.tracker import LivenessTracker
from proxy.relay.tasks import Background
from proxy.relay.upstream import UPSTREAM
from proxy.resume.assembly import resuming
from proxy.resume.clients import ClientStreams
from proxy.resume.decision import Policy
from proxy.resume.journal import JOURNAL
from proxy.resume.resumer import Fates, ResumeOptions
from proxy.resume.text import ProcessFate
from proxy.service.config import SETTINGS
from proxy.service.metrics import METRICS
from proxy.supervision.supervisor import SUPERVISOR, Orphans
from proxy.supervision.tool_processes import TOOL_PROCESSES
from proxy.writeback.scheduler import CountingWriter, Writer

__all__ = ["start_resume"]


async def start_resume(
    app: web.Application,
    stack: AsyncExitStack,
    *,
    probe: LivenessProbe,
    writer: Writer | None,
    tracker: LivenessTracker,
    background: Background,
    clients: ClientStreams | None,
) -> None:
    """`--resume`: a watch on the followed stream that hands what the crash interrupted to a resumer."""
    settings = app[SETTINGS]
    options = ResumeOptions(
        Policy(settings.resume_attempts, settings.resume_within),
        settings.grace,
        settings.dry_run,
        settings.resume_text,
    )
    assembled = await resuming(
        stack,
        session=app[UPSTREAM],
        origin=settings.upstream,
        probe=probe,
        writer=CountingWriter(writer, app[METRICS].write_backs) if writer is not None else None,
        credentials=Credentials.configured(settings.authorization),
        state_db=settings.state_db,
        journal=app[JOURNAL],
        options=options,
        fates=_fates(app),
        clients=clients,
    )
    if assembled is None:
        app[JOURNAL].enabled = False
        return
    watch, tasks = assembled
    tracker.listeners.append(watch)
    background.add(tasks)


def _fates(app: web.Application) -> Fates:
    """What became of an interrupted call's process: under `run`, what the supervisor adopted and
    ended; in front of a server the proxy did not start, what its records say still runs."""

    async def fates(calls: Sequence[str]) -> Mapping[str, ProcessFate]:
        if (supervisor := app.get(SUPERVISOR)) is not None:
            alive = {o.call.call: o for o in supervisor.orphans() if o.call is not None}
            ending = supervisor.health()["orphans"] == Orphans.TERMINATE
            found = {}
            for call in calls:
                if (orphan := alive.get(call)) is not None:
                    found[call] = (
                        ProcessFate.ENDED if ending and orphan.call_was_running else ProcessFate.LEFT_RUNNING
                    )
                elif supervisor.subreaper and supervisor.tool_processes.tied(call):
                    found[call] = ProcessFate.ENDED if ending else ProcessFate.GONE
            return found
        if (watcher := app.get(TOOL_PROCESSES)) is not None:
            left = {o.call.call for o in await watcher.left_running() if o.call is not None}
            return {call: ProcessFate.LEFT_RUNNING for call in calls if call in left}
        return {}

    return fates
