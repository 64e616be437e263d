"""Make a settlement durable, but only for a part confirmed orphaned twice.

A fetch that settles a part is the first confirmation (a liveness reading taken after the
body arrived). The write waits a grace period, takes a second reading, and hands the
session to a writer, which re-reads the parts and writes only those still unsettled. One
confirmation per session runs at a time; the pass is idempotent, so a later fetch that
schedules another finds nothing left to do.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Protocol

from proxy.config import WriteBackMode
from proxy.liveness import LivenessProbe, LivenessUnknown
from proxy.tasks import KeyedTasks
from proxy.upstream_api import Credentials
from rules import Api, Liveness

log = logging.getLogger(__name__)


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
    """Makes the settlements of one inactive session durable; re-reads before it writes."""

    @property
    def mode(self) -> WriteBackMode: ...

    async def write(
        self, api: Api, session_id: str, credentials: Credentials, liveness: Liveness
    ) -> list[Written]: ...


class WriteBack:
    """Schedules confirmations and writes; owns their tasks until `close()`."""

    def __init__(self, probe: LivenessProbe, writer: Writer, grace: float) -> None:
        self._probe = probe
        self._writer = writer
        self._grace = grace
        self._pending: KeyedTasks[tuple[Api, str]] = KeyedTasks("write-back")

    def schedule(self, api: Api, session_id: str, credentials: Credentials) -> None:
        """Confirm and write the session's settlements later, unless that is already under way."""
        self._pending.start((api, session_id), lambda: self._confirm_and_write(api, session_id, credentials))

    async def idle(self) -> None:
        """Wait for every scheduled write (tests and the offline command use this)."""
        await self._pending.idle()

    async def close(self) -> None:
        """Cancel what has not been written yet: an unconfirmed write is simply not made."""
        await self._pending.close()

    async def _confirm_and_write(self, api: Api, session_id: str, credentials: Credentials) -> None:
        await asyncio.sleep(self._grace)
        try:
            liveness = await self._probe.read(api, session_id, credentials)
        except LivenessUnknown as error:
            log.warning("write-back of %s skipped: liveness unknown (%s)", session_id, error)
            return
        if liveness.active:
            log.info("write-back of %s skipped: the session became active", session_id)
            return
        try:
            written = await self._writer.write(api, session_id, credentials, liveness)
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
