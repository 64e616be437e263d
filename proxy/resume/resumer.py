"""Resuming the turns a crash interrupted: settle durably, decide, claim once, send, see it start.

For each session the watch hands on: wait the grace period, and for the client streams open from
when the server was last heard until the crash to be back (bounded, `clients`); read the session
and its messages and rule out what needs nothing settled (a child session, a newer message, a
person waiting, too old); make the interrupted calls durable through the write-back and read the
messages again; take a liveness reading after that read; decide on all of it; claim the turn in
the ledger (committed) and record the prompt (committed); then wait for the server to be ready,
send, and confirm the turn started, or count the attempt and try again after a pause, up to the
budget (`prompting`).
Every decision is one line in the journal. With `dry_run` it decides and logs, and sends nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from proxy.opencode.client import Credentials
from proxy.opencode.dialects import Dialect
from proxy.relay.tasks import KeyedTasks
from proxy.resume.admission import Admission
from proxy.resume.candidates import Candidate
from proxy.resume.clients_back import Clients, clients_back
from proxy.resume.decision import (
    After,
    Before,
    Policy,
    ResumeOutcome,
    after_settling,
    before_settling,
    classed_calls,
    why_wait,
)
from proxy.resume.journal import Journal
from proxy.resume.last_turn import InterruptedTurn, last_turn
from proxy.resume.ledger import Ledger
from proxy.resume.prompting import Prompted, Prompting
from proxy.resume.safety import Classed, Safety
from proxy.resume.sending import READ_ERRORS, READY_TIMEOUT_S, read_failure, transient
from proxy.resume.text import Fates, no_fates, resume_text
from proxy.resume.waiting import Waiting, WaitingTurns
from proxy.writeback.scheduler import Writer
from rules import FRESH_MARGIN_MS, Api, Liveness

__all__ = ["Records", "ResumeOptions", "Resumer"]

log = logging.getLogger(__name__)
RETRY_PAUSE_S = 5.0
READ_PAUSE_S = 0.5
"""The first pause after a read of the restarted server failed for now; each next one is twice as long."""
NO_PATTERNS = Safety()
SETTLE_ATTEMPTS = 3
SETTLE_PAUSE_S = FRESH_MARGIN_MS / 1000 + 0.5
"""Past the margin within which no reading vouches for a call, by the server's clock (in whole seconds)."""


class Reader(Protocol):
    """Liveness on demand (`proxy.opencode.liveness.LivenessProbe`)."""

    async def read(self, api: Api, session_id: str, credentials: Credentials) -> Liveness: ...


class ResumeServer(Prompted, Protocol):
    """The restarted server as the resume uses it (`proxy.resume.sending.Server`)."""

    dialect: Dialect

    async def session_info(self, turn_api: Api, session_id: str) -> dict[str, Any]: ...

    async def waiting_on_person(self, session_id: str) -> str | None: ...

    async def resumes_itself(self) -> str | None: ...

    def heard(self, view: Any, session_id: str, since: str | None) -> None: ...


@dataclass(frozen=True, slots=True)
class ResumeOptions:
    policy: Policy
    grace: float
    dry_run: bool = False
    text: str | None = None
    """`--resume-text`: the prompt to send instead of the one that names the calls."""
    retry_pause: float = RETRY_PAUSE_S
    settle_pause: float = SETTLE_PAUSE_S
    settled_by: str | None = None
    """What makes the settlement durable when the server does it itself before any model work
    (2.x); None: the write-back must, before anything is sent."""
    safety: Safety = NO_PATTERNS
    """Which calls are continued by itself (`--resume-safe`, `--resume-unsafe`)."""
    auto: bool = True
    """`--resume`: continue by itself what is safe; False: every interrupted turn waits for a Continue."""
    read_pause: float = READ_PAUSE_S
    read_deadline: float = READY_TIMEOUT_S
    """How long reads that fail for now are tried again (as long as the server is waited to be ready)."""


@dataclass(frozen=True, slots=True)
class Records:
    """Where every resume is kept: the at-most-once `ledger`, and the `journal` of decisions."""

    ledger: Ledger
    journal: Journal


class Resumer:
    """Considers each candidate once at a time per session; owns those tasks until closed.

    Beside the server it learns what became of the interrupted calls' processes (`fates`) and
    waits for the client streams (`clients`; None: for none); a turn left for a person is kept in
    `waiting` and the continuations of one crash spaced by `admission` (None: its own of each)."""

    def __init__(
        self,
        server: ResumeServer,
        probe: Reader,
        records: Records,
        options: ResumeOptions,
        *,
        credentials: Credentials,
        writer: Writer | None,
        fates: Fates = no_fates,
        clients: Clients | None = None,
        waiting: WaitingTurns | None = None,
        admission: Admission | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.tasks: KeyedTasks[str] = KeyedTasks("resume")
        self._server = server
        self._probe = probe
        self._writer = writer
        self._ledger = records.ledger
        self._journal = records.journal
        self._options = options
        self._credentials = credentials
        self._fates = fates
        self._clients = clients
        self._clock = clock
        self._sleep = sleep
        self.waiting = waiting or WaitingTurns()
        self._admission = admission or Admission()
        self._prompting = Prompting(
            server,
            records.ledger,
            records.journal,
            attempts=options.policy.attempts,
            retry_pause=options.retry_pause,
            settled_by=options.settled_by,
        )

    def consider(self, candidate: Candidate) -> None:
        """Decide on `candidate` in the background; its place in the admission order is taken now."""
        ticket = self._admission.ticket()
        if not self.tasks.start(
            candidate.session_id,
            partial(self._guarded, self._considered, candidate, ticket, first=self._awaited),
        ):
            self._admission.drop(ticket)

    def proceed(self, waiting: Waiting) -> bool:
        """Continue a turn that waited, once (a person's Continue); False while a resume of its
        session is under way."""
        turn = waiting.turn
        last_alive = self._clock() - (time.time() - waiting.alive)
        candidate = Candidate(
            turn.session_id,
            turn.api,
            waiting.directory,
            last_alive,
            None,
            self._server.dialect,
            turn.message_id,
        )
        ticket = self._admission.ticket()
        work = partial(self._guarded, partial(self._continued, waiting), candidate, ticket)
        if not self.tasks.start(turn.session_id, work):
            self._admission.drop(ticket)
            return False
        return True

    async def _guarded(
        self,
        consider: Callable[[Candidate, int], Awaitable[None]],
        candidate: Candidate,
        ticket: int,
        *,
        first: Callable[[Candidate], Awaitable[None]] | None = None,
    ) -> None:
        """Decide after `first`; a read that failed for now (`transient`) decides nothing: the
        whole decision is taken again from the first read, after pauses growing from
        `read_pause`, until `read_deadline`. Each try re-reads everything (a person may act
        meanwhile) and the ledger's claim keeps it at most once. The admission place is given back
        during the pause (the others are not held up) and taken anew, last in line, for the next try."""
        try:
            if first is not None:
                await first(candidate)
            tries, slept, began = 1, 0.0, self._clock()
            while (error := await _read_failed(consider(candidate, ticket))) is not None:
                pause = self._options.read_pause * 2 ** (tries - 1)
                spent = max(self._clock() - began, slept)
                if not transient(error) or spent + pause > self._options.read_deadline:
                    self._skip(candidate, _unread(error, tries, spent))
                    return
                log.debug(
                    "resume of %s: try %d: %s; again in %g s",
                    candidate.session_id,
                    tries,
                    read_failure(error),
                    pause,
                )
                self._admission.drop(ticket)
                await self._sleep(pause)
                slept += pause
                ticket = self._admission.ticket()
                tries += 1
        except Exception as error:
            log.exception("resume of %s failed", candidate.session_id)
            self._skip(candidate, f"failed: {type(error).__name__}: {error}")
        finally:
            self._admission.drop(ticket)

    async def _awaited(self, candidate: Candidate) -> None:
        """Before the first try only: the grace period, and the client streams back."""
        await asyncio.sleep(self._options.grace)
        if self._clients is not None:
            await clients_back(self._clients, candidate.session_id, candidate.last_alive)

    async def _continued(self, waiting: Waiting, candidate: Candidate, ticket: int) -> None:
        """The waiting turn re-read (a person may have written since), then settled and continued
        as an automatic resume is: the same checks, prompt, ledger claim and admission; only
        `--resume-within` is not asked (the person chose to continue, however late)."""
        policy = dataclasses.replace(self._options.policy, within_s=math.inf)
        info = await self._server.session_info(candidate.api, candidate.session_id)
        before = await self._before(candidate, info, waiting.turn.message_id)
        if (verdict := before_settling(before, policy)).why is not None:
            self._skip(candidate, f"Continue: {verdict.why}", before.last.turn)
            return
        turn = before.last.turn
        assert turn is not None
        await self._settle_then_go(
            candidate, info, turn, waiting.directory, ticket=ticket, policy=policy, continued=waiting.calls
        )

    async def _considered(self, candidate: Candidate, ticket: int) -> None:
        if (unready := await self._server.ready(candidate.directory, None)) is not None:
            self._skip(candidate, f"the server did not become ready: {unready}")
            return
        if await self._left_to_server(candidate):
            return
        info = await self._server.session_info(candidate.api, candidate.session_id)
        before = await self._before(candidate, info)
        if (verdict := before_settling(before, self._options.policy)).why is not None:
            self._skip(candidate, verdict.why, before.last.turn)
            return
        turn = before.last.turn
        assert turn is not None
        directory = _directory(info) or candidate.directory
        if not self._options.auto:
            await self._detected(candidate, turn, directory)
            return
        await self._settle_then_go(
            candidate, info, turn, directory, ticket=ticket, policy=self._options.policy
        )

    async def _detected(self, candidate: Candidate, turn: InterruptedTurn, directory: str | None) -> None:
        """Without `--resume`: nothing is written nor sent, and a turn the restarted server still
        runs is none; any other waits for a Continue, which settles it first."""
        if (await self._probe.read(candidate.api, candidate.session_id, self._credentials)).active:
            self._skip(candidate, "the session is running: the server did not lose the turn", turn)
            return
        classed = classed_calls(turn, turn, self._options.safety)
        why = why_wait(turn, classed, self._options.safety, auto=False)
        await self._wait(candidate, turn, directory, classed, why or "")

    async def _settle_then_go(
        self,
        candidate: Candidate,
        info: dict[str, Any],
        turn: InterruptedTurn,
        directory: str | None,
        *,
        ticket: int,
        policy: Policy,
        continued: tuple[Classed, ...] | None = None,
    ) -> None:
        """Settle the turn durably, decide on the re-read, then continue it: by itself if it is
        safe, else leave it waiting; `continued` (the classes it waited with) continues it anyway."""
        after = await self._settled(candidate, info, turn)
        if (verdict := after_settling(after, policy)).why is not None:
            self._skip(candidate, verdict.why, after.before.last.turn or turn)
            return
        settled = after.before.last.turn
        assert settled is not None
        if continued is not None:
            await self._resume(candidate, settled, directory, continued, ticket)
            return
        classed = classed_calls(settled, turn, self._options.safety)
        if (why := why_wait(settled, classed, self._options.safety, auto=True)) is not None:
            await self._wait(candidate, settled, directory, classed, why)
            return
        await self._resume(candidate, settled, directory, classed, ticket)

    async def _settled(self, candidate: Candidate, info: dict[str, Any], turn: InterruptedTurn) -> After:
        """The session re-read after its open calls were written back. A call last alive within
        the freshness margin of the reading is left open by the write-back (no reading vouches for
        it yet): written again after a pause, a few times, before the turn is given up. A server
        that settles them itself before any model work (2.x) is only re-read."""
        if self._options.settled_by is not None:
            return await self._after(candidate, info, turn.message_id)
        for _ in range(SETTLE_ATTEMPTS - 1):
            after = await self._written_and_reread(candidate, info, turn)
            reread = after.before.last.turn
            if reread is None or after.active or not any(call.still_open for call in reread.calls):
                return after
            await asyncio.sleep(self._options.settle_pause)
            turn = reread
        return await self._written_and_reread(candidate, info, turn)

    async def _written_and_reread(
        self, candidate: Candidate, info: dict[str, Any], turn: InterruptedTurn
    ) -> After:
        if (open_calls := [c.call_id for c in turn.calls if c.still_open]) and not self._options.dry_run:
            await self._settle(turn, open_calls)
        return await self._after(candidate, info, turn.message_id)

    async def _before(self, candidate: Candidate, info: dict[str, Any], cut_off: str | None = None) -> Before:
        view = await self._server.messages(candidate.api, candidate.session_id)
        self._server.heard(view, candidate.session_id, cut_off or candidate.seen_message)
        parent = info.get("parentID")
        person = candidate.waiting_on_person or await self._server.waiting_on_person(candidate.session_id)
        rules, seen = self._server.rules(candidate.api), candidate.seen_message
        last = last_turn(view, rules, candidate.session_id, seen=seen, cut_off=cut_off)
        witnessed = last.turn is None or (seen is not None and last.turn.message_id >= seen)
        return Before(
            last,
            parent if isinstance(parent, str) and parent else None,
            person,
            self._clock() - candidate.last_alive,
            witnessed,
        )

    async def _settle(self, turn: InterruptedTurn, open_calls: list[str]) -> None:
        """Make the open calls durable through the write-back (it re-reads, then confirms, then
        writes only what is still open and vouched for)."""
        if self._writer is None:
            return

        async def confirm() -> Liveness:
            return await self._probe.read(turn.api, turn.session_id, self._credentials)

        targets = [*open_calls, turn.message_id]
        written = await self._writer.write(turn.api, turn.session_id, self._credentials, targets, confirm)
        for item in written:
            log.info(
                "wrote back before resuming mode=%s api=%s session=%s message=%s part=%s rule=%s",
                self._writer.mode,
                item.api,
                item.session_id,
                item.message_id,
                item.part or "-",
                item.rule,
                extra={"fields": {"session": item.session_id, "message": item.message_id, "part": item.part}},
            )

    async def _after(self, candidate: Candidate, info: dict[str, Any], cut_off: str) -> After:
        """What is decided on once the calls were settled: the session re-read (as if settled, in a
        dry run), a liveness reading taken after it, and the attempts already used on the turn."""
        before = await self._before(candidate, info, cut_off)
        if self._options.dry_run:
            before = _as_if_settled(before)
        liveness = await self._probe.read(candidate.api, candidate.session_id, self._credentials)
        used = await self._attempts_used(before.last.turn)
        elsewhere = self._running_elsewhere(liveness, candidate)
        return After(before, liveness.active, elsewhere, used, self._options.settled_by)

    async def _attempts_used(self, turn: InterruptedTurn | None) -> int:
        """The prompts the ledger has recorded for `turn` (by any proxy on the state database)."""
        if turn is None:
            return 0
        return await self._ledger.used(turn.session_id, turn.prompted_by, turn.message_id)

    def _running_elsewhere(self, liveness: Liveness, candidate: Candidate) -> str | None:
        """Why another process on the database may still run the turn: one running since before the
        turn's last sign of life. A tool runs only in a process that existed when it started: one
        started after it cannot be running it (it could only start a turn of its own, which adds a
        message, and a newer message already rules a resume out)."""
        last_alive_ms = int((time.time() - (self._clock() - candidate.last_alive)) * 1000)
        if liveness.elsewhere_since is not None and liveness.elsewhere_since <= last_alive_ms:
            return f"one running since {liveness.elsewhere_since} ms (epoch), before the turn ended"
        return None

    async def _wait(
        self,
        candidate: Candidate,
        turn: InterruptedTurn,
        directory: str | None,
        classed: tuple[Classed, ...],
        why: str,
    ) -> None:
        """Leave the turn for a person: kept, told, and said in the journal."""
        calls = [call.as_json() for call in classed]
        if self._options.dry_run:
            why = f"{why} (--dry-run: not kept)"
        else:
            now = time.time()
            alive = now - (self._clock() - candidate.last_alive)
            line = self._server.dialect.name
            await self.waiting.add(Waiting(turn, directory, classed, now, why, line, alive))
        self._journal.decided(
            ResumeOutcome.WAITING, turn.api, turn.session_id, why, message=turn.message_id, calls=calls
        )

    async def _resume(
        self,
        candidate: Candidate,
        turn: InterruptedTurn,
        directory: str | None,
        classed: tuple[Classed, ...],
        ticket: int,
    ) -> None:
        fates = await self._fates([call.call_id for call in turn.calls])
        text = self._options.text or resume_text(turn.calls, fates)
        calls = [call.as_json() for call in classed]
        if self._options.dry_run:
            why = "--dry-run: nothing sent"
            self._journal.decided(
                ResumeOutcome.WOULD_RESUME,
                turn.api,
                turn.session_id,
                why,
                message=turn.message_id,
                calls=calls,
            )
            return
        if await self._left_to_server(candidate, turn):
            return
        async with self._admission.admitted(ticket) as admitted:
            await self._prompting.resume(turn, directory, text, calls, admitted=admitted)

    async def _left_to_server(self, candidate: Candidate, turn: InterruptedTurn | None = None) -> bool:
        """Whether the server continues interrupted turns itself (`serve --service`), so that a
        continuation of the proxy's would be a second one: then the turn is left to it."""
        if (why := await self._server.resumes_itself()) is None:
            return False
        self._skip(candidate, f"the server resumes interrupted turns itself, left to it: {why}", turn)
        return True

    def _skip(self, candidate: Candidate, why: str, turn: InterruptedTurn | None = None) -> None:
        message = turn.message_id if turn is not None else None
        self._journal.decided(
            ResumeOutcome.SKIPPED, candidate.api, candidate.session_id, why, message=message
        )


async def _read_failed(decided: Awaitable[None]) -> Exception | None:
    """The read that failed the decision, if one did."""
    try:
        await decided
    except READ_ERRORS as error:
        return error
    return None


def _unread(error: Exception, tries: int, spent: float) -> str:
    """The skip's reason: what was asked and what came back, and, when it was asked again, how often."""
    if not transient(error):
        return f"the server could not be read: {read_failure(error)}"
    return f"the server could not be read in {tries} tries over {spent:.1f} s: {read_failure(error)}"


def _as_if_settled(before: Before) -> Before:
    """Nothing was written (a dry run): decide as if the write-back had settled what it would."""
    if (turn := before.last.turn) is None:
        return before
    calls = tuple(dataclasses.replace(call, still_open=False) for call in turn.calls)
    last = dataclasses.replace(before.last, turn=dataclasses.replace(turn, calls=calls))
    return dataclasses.replace(before, last=last)


def _directory(info: dict[str, Any]) -> str | None:
    directory = info.get("directory")
    if not isinstance(directory, str):
        location = info.get("location")
        directory = location.get("directory") if isinstance(location, dict) else None
    return directory if isinstance(directory, str) and directory else None
