"""Make a settlement durable, but only what a fetch found orphaned, and only on a reading that
is later than what it writes.

A fetch that settles a part is the first confirmation (a liveness reading taken after the
body arrived), and names what it settled: the part (v1) or call (v2) ids, or a message's id
for a change to the message itself. The write waits a grace period and hands the session to
a writer, which re-reads the session, then takes the second reading, then writes only the
named parts still open in the re-read that this reading vouches for (inactive, and taken well
after their last sign of life, in the server's clock). A turn that starts in between is seen
in the reading, and its new parts were never named. One pass per session runs at a time;
ids named while one is pending join it, and ids named while one is writing (it has taken its
batch) get the next pass, after a grace period of their own, with no later fetch needed. The
pass is idempotent, so a later fetch that schedules another finds nothing left to do.

Every decision on a named id (written, skipped and why, failed) is one log line with the same
structured fields as the view path's settle lines, and `WriteBack.settled` awaits them.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client import Counter

from proxy.opencode.client import Credentials
from proxy.opencode.liveness import LivenessProbe, LivenessUnknown
from proxy.opencode.server_line import TOLD_1_18, ServerLine
from proxy.relay.tasks import Idles, KeyedTasks
from proxy.writeback.decisions import (
    BECAME_ACTIVE,
    NOT_VOUCHED,
    Decisions,
    WriteBackOutcome,
    Written,
    is_message,
)
from proxy.writeback.modes import WriteBackMode
from rules import Api, Change, Liveness

log = logging.getLogger(__name__)

__all__ = [
    "Confirm",
    "CountingWriter",
    "ServersWrittenInto",
    "WriteBack",
    "WriteBackOutcome",
    "Writer",
    "Written",
    "targeted",
]


Confirm = Callable[[], Awaitable[Liveness]]
"""Takes the reading a write rests on; a writer calls it after its re-read, never before."""


class Writer(Protocol):
    """Makes the settlements of one session durable: re-reads, then `confirm()`s, then writes
    only `targets` that are still open and that the reading vouches for."""

    @property
    def mode(self) -> WriteBackMode: ...

    async def write(
        self, api: Api, session_id: str, credentials: Credentials, targets: Collection[str], confirm: Confirm
    ) -> list[Written]: ...


class _WrappingWriter:
    """A writer around another, in its mode."""

    def __init__(self, writer: Writer) -> None:
        self._writer = writer

    @property
    def mode(self) -> WriteBackMode:
        return self._writer.mode


class CountingWriter(_WrappingWriter):
    """A writer that counts what the writer it wraps achieved, by mode and outcome."""

    def __init__(self, writer: Writer, write_backs: Counter) -> None:
        super().__init__(writer)
        self._write_backs = write_backs

    async def write(
        self, api: Api, session_id: str, credentials: Credentials, targets: Collection[str], confirm: Confirm
    ) -> list[Written]:
        outcome = "failed"
        try:
            written = await self._writer.write(api, session_id, credentials, targets, confirm)
            outcome = "written" if written else "nothing"
            return written
        finally:
            self._write_backs.labels(self.mode, outcome).inc()


class ServersWrittenInto(_WrappingWriter):
    """A writer that writes only into a server its mode writes into (`KnownServer.refusal`),
    asked when it writes: for a caller that writes outside the scheduler (the resume), on a line
    that may be a release or a build no writes were measured on."""

    def __init__(self, writer: Writer, server: ServerLine) -> None:
        super().__init__(writer)
        self._server = server

    async def write(
        self, api: Api, session_id: str, credentials: Credentials, targets: Collection[str], confirm: Confirm
    ) -> list[Written]:
        known = await self._server.known(credentials)
        refused = "which server the upstream is is not known" if known is None else known.refusal(self.mode)
        if refused is not None:
            fields = {"session": session_id, "mode": str(self.mode), "why": refused}
            log.info("nothing written back for session %s: %s", session_id, refused, extra={"fields": fields})
            return []
        return await self._writer.write(api, session_id, credentials, targets, confirm)


def targeted(change: Change, targets: Collection[str]) -> bool:
    """Whether a change settles something the fetch named (its part or call, or its message)."""
    return change.target.key in targets


Session = tuple[Api, str]


@dataclass(slots=True)
class _Batch:
    """Ids named for one session's next pass, with the credentials of the first fetch naming them."""

    credentials: Credentials
    targets: set[str] = field(default_factory=set)


class WriteBack:
    """Schedules confirmations and writes; owns their tasks until `close()`, which cancels what
    has not been written yet: an unconfirmed write is simply not made.

    A session's passes run one after another in one task, for as long as ids are pending; each
    task has a key of its own, so that a session named just as its task ends starts a new one.
    """

    def __init__(
        self, probe: LivenessProbe, writer: Writer, grace: float, *, server: ServerLine | None = None
    ) -> None:
        self._server = server or ServerLine.told(TOLD_1_18)
        self._passing: KeyedTasks[tuple[Api, str, int]] = KeyedTasks("write-back")
        self._probe = probe
        self._writer = writer
        self._grace = grace
        self._pending: dict[Session, _Batch] = {}
        self._writing: dict[Session, set[str]] = {}
        self._running: set[Session] = set()
        self._serial = itertools.count()
        self._decisions = Decisions(writer.mode)

    def schedule(self, api: Api, session_id: str, credentials: Credentials, targets: Iterable[str]) -> None:
        """Confirm and write the named settlements of the session later: with any named while a
        pass of it is pending, or in a pass of their own after the one writing now. Nothing is
        scheduled on a server this mode does not write to (said once, when it became known)."""
        known = self._server.current
        if known is None or known.refusal(self._writer.mode) is not None:
            return
        session, named = (api, session_id), set(targets)
        if self._writer.mode is WriteBackMode.API:
            messages = {key for key in named if is_message(key)}
            self._decisions.view_only(session, messages)
            named -= messages
        if not named:
            return
        self._pending.setdefault(session, _Batch(credentials)).targets.update(named)
        if session not in self._running:
            self._running.add(session)
            self._passing.start((api, session_id, next(self._serial)), lambda: self._passes(session))

    async def settled(self, api: Api, session_id: str, ids: Collection[str]) -> dict[str, WriteBackOutcome]:
        """Wait until no pass is pending or writing for any of `ids` of the session, and say how
        each ended: `WRITTEN` is durable; anything else was not written by this proxy (re-read
        the session to see whether it is open). An id never named, or decided so long ago that
        it is forgotten, is `UNKNOWN` at once. For callers that must not act before settlement
        is durable (a resumed turn must not start while its orphan could still be written)."""
        session, wanted = (api, session_id), set(ids)
        while wanted & self._undecided(session):
            await self._decisions.changed()
        return {item: self._decisions.outcome(api, session_id, item) for item in wanted}

    def _undecided(self, session: Session) -> set[str]:
        batch = self._pending.get(session)
        return (batch.targets if batch else set()) | self._writing.get(session, set())

    async def _passes(self, session: Session) -> None:
        """One pass after another while ids are pending for the session."""
        try:
            while (batch := self._pending.get(session)) is not None:
                await asyncio.sleep(self._grace)
                del self._pending[session]
                self._writing[session] = batch.targets
                await self._pass(session, batch)
                del self._writing[session]
                self._decisions.announce()
        finally:
            self._end(session)

    @property
    def tasks(self) -> Idles:
        """The passes, pending or writing, for `Background` (and tests) to wait for; they are
        closed by `close` alone, which also ends the waits on what they would have written."""
        return self._passing

    async def close(self) -> None:
        """Cancel every pass (a task cancelled before it ran never ran its own `finally`), and
        end every wait on what they would have written."""
        await self._passing.close()
        for session in {*self._running, *self._pending, *self._writing}:
            self._end(session)

    def _end(self, session: Session) -> None:
        """The session has no pass any more: what is still named is not written."""
        self._running.discard(session)
        left = self._writing.pop(session, set())
        if (batch := self._pending.pop(session, None)) is not None:
            left |= batch.targets
        self._decisions.skipped(session, left, "the proxy closed before writing it")

    async def _refused(self, credentials: Credentials) -> str | None:
        """Why nothing may be written now: the server restarted since the fetch, and is not known
        again yet or is one this mode does not write to."""
        known = await self._server.known(credentials)
        if known is None:
            return "the upstream's opencode server is not known"
        return known.refusal(self._writer.mode)

    async def _pass(self, session: Session, batch: _Batch) -> None:
        api, session_id = session
        became_active = False
        if (refused := await self._refused(batch.credentials)) is not None:
            self._decisions.skipped(session, batch.targets, refused)
            return

        async def confirm() -> Liveness:
            nonlocal became_active
            liveness = await self._probe.read(api, session_id, batch.credentials)
            became_active = liveness.active
            return liveness

        try:
            written = await self._writer.write(api, session_id, batch.credentials, batch.targets, confirm)
        except LivenessUnknown as error:
            self._decisions.failed(session, batch.targets, f"liveness unknown ({error})")
            return
        except Exception as error:
            self._decisions.failed(session, batch.targets, f"{type(error).__name__}: {error}", error=error)
            return
        self._decisions.written(written)
        left = batch.targets - {item.key for item in written}
        if became_active:
            self._decisions.skipped(session, left, BECAME_ACTIVE)
            return
        self._decisions.skipped(session, left, NOT_VOUCHED)
