"""Putting `--resume` together, from values, in one place: its ledger, its servers, its resumers
and the busy sessions that hand them candidates, as one part of the application (`Resuming`).

A candidate is resumed as the line whose stream showed it resumes a turn: on 1.18 through a
prompt, after the proxy's write-back settled its calls; on 2.x through the server's own
settle-then-continue. A line on which the settlement cannot be made durable (1.18 without
`--write-back`) resumes nothing, and says so of each candidate in the journal."""

from __future__ import annotations

import dataclasses
import functools
import logging
import sqlite3
from collections.abc import Callable, Iterable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from yarl import URL

from proxy.opencode.client import Credentials, UpstreamApi
from proxy.opencode.dialects import LINE_1_18, LINE_2X, Dialect
from proxy.opencode.liveness import LivenessProbe
from proxy.opencode.tracker import FollowedEvent, StreamListener
from proxy.opencode.vocabulary import mentioned_message
from proxy.relay.tasks import KeyedTasks, Together, Working
from proxy.resume.admission import Admission
from proxy.resume.candidates import BusySessions, Candidate
from proxy.resume.clients_back import Clients
from proxy.resume.continuing import Continuation
from proxy.resume.decision import ResumeOutcome
from proxy.resume.journal import Journal
from proxy.resume.ledger import Ledger
from proxy.resume.resumer import Records, ResumeOptions, Resumer
from proxy.resume.sending import Server
from proxy.resume.text import Fates, no_fates
from proxy.resume.waiting import Announcer, Continued, NotWaiting, Waiting, WaitingTurns
from proxy.writeback.scheduler import Writer

__all__ = ["Resuming", "open_ledger", "resuming"]

log = logging.getLogger(__name__)


async def open_ledger(stack: AsyncExitStack, state_db: Path | None, *, asked: bool = True) -> Ledger | None:
    """The durable record of each resume in `state_db`, closed with `stack`; or None, said once
    in the log (a warning when `--resume` was `asked` for), when none can be kept: without it,
    nothing is resumed and no turn waits for a Continue."""
    level = logging.WARNING if asked else logging.INFO
    what = "--resume is off" if asked else "interrupted turns are not kept for a Continue"
    if state_db is None:
        log.log(level, "%s: there is no state database to record resumes in", what)
        return None
    try:
        return await stack.enter_async_context(Ledger.open(state_db))
    except (OSError, sqlite3.Error) as error:
        log.log(level, "%s: the state database %s cannot be used: %s", what, state_db, error)
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
    admission: Admission | None = None,
    announcer: Announcer | None = None,
) -> Resuming:
    """Resume as a part that follows the stream, recording in `ledger`, its resumers closed with
    `stack`. `writer` is the write-back's, counted as it is; `fates` what became of the
    interrupted calls' processes; `health_route` the route a server of a line was known by
    (`ServerLine.health_route`), which a continuation asks whether it is up; `admission` spaces
    continuations; `announcer` tells a person of a turn that waits for them (None: no one is told
    but the log and `/_settle/resume`)."""
    api = UpstreamApi(session, origin)
    waiting = WaitingTurns(announcer, ledger)
    resumers = functools.partial(
        Resumer,
        probe=probe,
        records=Records(ledger, journal),
        credentials=credentials,
        fates=fates,
        clients=clients,
        waiting=waiting,
        admission=admission or Admission(),
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
    _said(options, [way.why for way in by_line.values() if isinstance(way, _Refused)])
    busy = BusySessions(lambda candidate: by_line[candidate.dialect.name].consider(candidate))
    ends: KeyedTasks[str] = KeyedTasks("resume-waits")
    stack.push_async_callback(ends.close)
    return Resuming(busy, Together(ends, *(resumer.tasks for resumer in running)), waiting, by_line, ends)


def _said(options: ResumeOptions, refused: Iterable[str]) -> None:
    """What resume does, said once as it starts, before the server is known: so for each line on
    which it does nothing (1.18 without a write-back), that too."""
    nowhere = "".join(f"; but {why}" for why in refused)
    if not options.auto:
        log.info(
            "resume detects interrupted turns: each waits for a Continue (POST /_settle/resume/<session>)%s",
            nowhere,
        )
        return
    log.info(
        "resume is on%s: at most %d prompt(s) per interrupted turn, within %g s; %s%s",
        " (dry run: nothing is sent)" if options.dry_run else "",
        options.policy.attempts,
        options.policy.within_s,
        "every turn continued (--resume-unsafe)"
        if options.safety.unsafe_ok
        else "a turn with an unsafe call waits for a person",
        nowhere,
    )


class Resuming(StreamListener, Working):
    """Resume in the application: follows the server's stream (its `BusySessions`), holds its resumers'
    background work (`tasks`), says which sessions it would consider should the server die now
    (`running`), keeps the turns that wait for a person (`waiting`: a message of theirs in the
    session ends the wait) and continues one on a person's word (`proceed`)."""

    def __init__(
        self,
        busy: BusySessions,
        tasks: Together,
        waiting: WaitingTurns,
        by_line: Mapping[str, Resumer | _Refused],
        ends: KeyedTasks[str],
    ) -> None:
        self._busy = busy
        self.tasks = tasks
        self.waiting = waiting
        self._by_line = by_line
        self._ends = ends

    def following(self) -> None:
        self._busy.following()

    def event(self, event: FollowedEvent) -> None:
        self._busy.event(event)
        session_id = event.session_id
        if session_id is None or (waiting := self.waiting.get(session_id)) is None:
            return
        message = mentioned_message(event.kind, event.properties)
        if message is not None and message > waiting.turn.message_id:
            why = f"a newer message {message} in the session: it is the person's again"
            self._ends.start(session_id, functools.partial(self.waiting.end, session_id, why))

    def running(self) -> list[str]:
        return self._busy.running()

    def refusal(self, line: str) -> str | None:
        """Why nothing is resumed, and no turn waits, on `line` (a dialect's name); None if they do."""
        way = self._by_line.get(line)
        return way.why if isinstance(way, _Refused) else None

    async def proceed(self, session_id: str, line: str | None = None) -> Waiting:
        """Continue the session's waiting turn once (`POST /_settle/resume/{session}`): raises
        `NotWaiting` when none waits (saying so of `line`, the server's, when no turn waits on it),
        `Continued` when it was continued already."""
        found = self.waiting.get(session_id)
        if found is None and line is not None and (why := self.refusal(line)) is not None:
            raise NotWaiting(f"no turn waits for a person here: {why}")
        resumer = self._by_line.get(found.line) if found is not None else None
        if found is not None and not isinstance(resumer, Resumer):
            raise NotWaiting(f"the {found.line} line resumes nothing here")
        waiting = await self.waiting.take(session_id)
        assert isinstance(resumer, Resumer)
        if not resumer.proceed(waiting):
            raise Continued("a resume of this session is under way")
        return waiting


@dataclass(frozen=True, slots=True)
class _Refused:
    """A line on which `--resume` does nothing: each of its candidates is skipped, said why."""

    journal: Journal
    why: str

    auto: bool = True

    def consider(self, candidate: Candidate) -> None:
        if not self.auto:  # without --resume, a line that cannot resume has nothing to say
            return
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
        return _Refused(journal, refused, options.auto)
    settled_by = line.settles_before_resume
    return resumers(
        server,
        writer=writer if settled_by is None else None,
        options=dataclasses.replace(options, settled_by=settled_by),
    )
