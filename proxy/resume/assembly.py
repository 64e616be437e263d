"""Putting `--resume` together, from values, in one place: its ledger, its servers, its resumers
and the watch that hands them candidates, as one part of the application (`Resuming`).

A candidate is resumed as the line whose stream showed it resumes a turn: on 1.18 through a
prompt, after the proxy's write-back settled its calls; on 2.x through the server's own
settle-then-continue. A line on which the settlement cannot be made durable (1.18 without
`--write-back`) resumes nothing, and says so of each candidate in the journal."""

from __future__ import annotations

import dataclasses
import functools
import logging
import sqlite3
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from yarl import URL

from proxy.opencode.client import Credentials, UpstreamApi
from proxy.opencode.dialects import LINE_1_18, LINE_2X, Dialect
from proxy.opencode.liveness import LivenessProbe
from proxy.opencode.tracker import GlobalEvent, StreamListener
from proxy.relay.tasks import Together
from proxy.resume.clients import Clients
from proxy.resume.continuing import Continuation
from proxy.resume.decision import ResumeOutcome
from proxy.resume.fates import Fates, no_fates
from proxy.resume.journal import Journal
from proxy.resume.ledger import Ledger
from proxy.resume.resumer import Known, Records, ResumeOptions, Resumer
from proxy.resume.sending import Server
from proxy.resume.watch import Candidate, Watch
from proxy.writeback.scheduler import Writer

__all__ = ["Resuming", "open_ledger", "resuming"]

log = logging.getLogger(__name__)


async def open_ledger(stack: AsyncExitStack, state_db: Path | None) -> Ledger | None:
    """The durable record of each resume in `state_db`, closed with `stack`; or None, said once
    in the log, when none can be kept: without it, nothing is resumed (`--resume` is off)."""
    if state_db is None:
        log.warning("--resume is off: there is no state database to record resumes in")
        return None
    try:
        return await stack.enter_async_context(Ledger.open(state_db))
    except (OSError, sqlite3.Error) as error:
        log.warning("--resume is off: the state database %s cannot be used: %s", state_db, error)
        return None


def resuming(
    stack: AsyncExitStack,
    *,
    ledger: Ledger,
    session: aiohttp.ClientSession,
    origin: URL,
    probe: LivenessProbe,
    writer: Writer | None,
    credentials: Credentials,
    journal: Journal,
    options: ResumeOptions,
    fates: Fates = no_fates,
    clients: Clients | None = None,
    health_route: Callable[[Dialect], str] = lambda dialect: dialect.health_paths[0],
) -> Resuming:
    """`--resume` as a part that follows the stream, recording in `ledger`, its resumers closed
    with `stack`. `writer` is the write-back's, counted as it is; `fates` what became of the
    interrupted calls' processes; `health_route` the route a server of a line was known by
    (`ServerLine.health_route`), which a continuation asks whether it is up."""
    api = UpstreamApi(session, origin)
    resumers = functools.partial(
        Resumer,
        probe=probe,
        records=Records(ledger, journal),
        credentials=credentials,
        known=Known(fates, clients),
    )
    servers = (
        Server(session, api, probe, origin, credentials, dialect=LINE_1_18),
        Continuation(
            session, api, probe, origin, credentials, health_route=functools.partial(health_route, LINE_2X)
        ),
    )
    by_line = {
        server.dialect.name: _on_line(server, writer, options, journal, resumers) for server in servers
    }
    running = [resumer for resumer in by_line.values() if isinstance(resumer, Resumer)]
    for resumer in running:
        stack.push_async_callback(resumer.tasks.close)
    log.info(
        "resume is on%s: at most %d prompt(s) per interrupted turn, within %g s",
        " (dry run: nothing is sent)" if options.dry_run else "",
        options.policy.attempts,
        options.policy.within_s,
    )
    watch = Watch(lambda candidate: by_line[candidate.dialect.name].consider(candidate))
    return Resuming(watch, Together(*(resumer.tasks for resumer in running)))


class Resuming(StreamListener):
    """`--resume` in the application: follows the server's stream (its `Watch`), holds its
    resumers' background work (`tasks`), and says which sessions it would consider should the
    server die now (`running`)."""

    def __init__(self, watch: Watch, tasks: Together) -> None:
        self._watch = watch
        self.tasks = tasks

    def following(self) -> None:
        self._watch.following()

    def event(self, event: GlobalEvent) -> None:
        self._watch.event(event)

    def running(self) -> list[str]:
        return self._watch.running()


@dataclass(frozen=True, slots=True)
class _Refused:
    """A line on which `--resume` does nothing: each of its candidates is skipped, said why."""

    journal: Journal
    why: str

    def consider(self, candidate: Candidate) -> None:
        why = f"--resume does nothing: {self.why}"
        self.journal.decided(ResumeOutcome.SKIPPED, candidate.api, candidate.session_id, why)


def _on_line(
    server: Server,
    writer: Writer | None,
    options: ResumeOptions,
    journal: Journal,
    resumers: Callable[..., Resumer],
) -> Resumer | _Refused:
    """What considers a candidate of `server`'s line: a resumer that settles through the
    write-back, or, on a line that settles by itself before any model work, only re-reads; or,
    where no settlement can be made durable (1.18 without a writer), nothing but a skip."""
    line = server.dialect
    if (refused := line.resume_refusal(writer.mode if writer is not None else None)) is not None:
        return _Refused(journal, refused)
    settled_by = line.settles_before_resume
    return resumers(
        server,
        writer=writer if settled_by is None else None,
        options=dataclasses.replace(options, settled_by=settled_by),
    )
