"""Make a settlement durable, but only what a fetch found orphaned, and only on a reading that
is later than what it writes.

A fetch that settles a part is the first confirmation (a liveness reading taken after the
body arrived), and names what it settled: the part (v1) or call (v2) ids, or a message's id
for a change to the message itself. The write waits a grace period and hands the session to
a writer, which re-reads the session, then takes the second reading, then writes only the
named parts still open in the re-read that this reading vouches for (inactive, and taken well
after their last sign of life, in the server's clock). A turn that starts in between is seen
in the reading, and its new parts were never named. One write per session runs at a time;
ids named while one is pending join it. The pass is idempotent, so a later fetch that
schedules another finds nothing left to do.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from prometheus_client import Counter

from proxy.opencode.client import Credentials
from proxy.opencode.liveness import LivenessProbe, LivenessUnknown
from proxy.relay.tasks import KeyedTasks
from rules import Api, Change, Liveness

log = logging.getLogger(__name__)


class WriteBackMode(StrEnum):
    """Where settlements are made durable: nowhere, through the server's API, or in its database."""

    OFF = "off"
    API = "api"
    DB = "db"


Confirm = Callable[[], Awaitable[Liveness]]
"""Takes the reading a write rests on; a writer calls it after its re-read, never before."""


@dataclass(frozen=True, slots=True)
class Written:
    """One settled part (or message) made durable, for the log."""

    api: Api
    session_id: str
    message_id: str
    part: str | None
    """The part (v1) or call (v2) written; None for a change to the message itself."""
    rule: str


class Writer(Protocol):
    """Makes the settlements of one session durable: re-reads, then `confirm()`s, then writes
    only `targets` that are still open and that the reading vouches for."""

    @property
    def mode(self) -> WriteBackMode: ...

    async def write(
        self, api: Api, session_id: str, credentials: Credentials, targets: Collection[str], confirm: Confirm
    ) -> list[Written]: ...


class CountingWriter:
    """A writer that counts what the writer it wraps achieved, by mode and outcome."""

    def __init__(self, writer: Writer, write_backs: Counter) -> None:
        self._writer = writer
        self._write_backs = write_backs

    @property
    def mode(self) -> WriteBackMode:
        return self._writer.mode

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


def targeted(change: Change, targets: Collection[str]) -> bool:
    """Whether a change settles something the fetch named (its part or call, or its message)."""
    return change.target.key in targets


class WriteBack(KeyedTasks[tuple[Api, str]]):
    """Schedules confirmations and writes; owns their tasks until `close()`, which cancels what
    has not been written yet: an unconfirmed write is simply not made."""

    def __init__(self, probe: LivenessProbe, writer: Writer, grace: float) -> None:
        super().__init__("write-back")
        self._probe = probe
        self._writer = writer
        self._grace = grace
        self._targets: dict[tuple[Api, str], set[str]] = {}

    def schedule(self, api: Api, session_id: str, credentials: Credentials, targets: Iterable[str]) -> None:
        """Confirm and write the named settlements of the session later (with any named while a
        write of it is already pending)."""
        self._targets.setdefault((api, session_id), set()).update(targets)
        self.start((api, session_id), lambda: self._confirm_and_write(api, session_id, credentials))

    async def _confirm_and_write(self, api: Api, session_id: str, credentials: Credentials) -> None:
        await asyncio.sleep(self._grace)
        targets = self._targets.pop((api, session_id), set())

        async def confirm() -> Liveness:
            liveness = await self._probe.read(api, session_id, credentials)
            if liveness.active:
                log.info("write-back of %s skipped: the session became active", session_id)
            return liveness

        try:
            written = await self._writer.write(api, session_id, credentials, targets, confirm)
        except LivenessUnknown as error:
            log.warning("write-back of %s skipped: liveness unknown (%s)", session_id, error)
            return
        except Exception:
            log.exception(
                "write-back of %s failed (mode=%s); nothing half-written", session_id, self._writer.mode
            )
            return
        for item in written:
            log.info(
                "wrote back mode=%s api=%s session=%s message=%s part=%s rule=%s",
                self._writer.mode,
                item.api,
                item.session_id,
                item.message_id,
                item.part or "-",
                item.rule,
            )
