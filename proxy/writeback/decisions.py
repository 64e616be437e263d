"""What write-back decided about each id a fetch named: one structured log line per decision
(written, skipped and why, failed), and a bounded memory of how each ended, which
`WriteBack.settled` reads.

The lines carry the fields the view path's settle lines carry (`session`, `message`, `part`,
`api`, `rule`, `why`) and `mode` and `outcome`, so that `--log-format json` can follow one part
from the view that settled it to the write that made it durable.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from proxy.relay.bounded import Bounded
from rules import Api

log = logging.getLogger(__name__)

OUTCOMES_KEPT = 4096
"""How many decided ids are remembered for `WriteBack.settled`, the least recently decided or
read forgotten first. A caller asks for the ids of one turn right after scheduling them, so a
few thousand outlast any wait many times over; a forgotten one reads `UNKNOWN`, which callers
already take as not written by this proxy (and re-read the session)."""

WRITTEN_WHY = "still open when re-read; inactive in a reading taken after the re-read"
BECAME_ACTIVE = "the session became active"
NOT_VOUCHED = (
    "no longer open when re-read, not vouched for by the reading taken after the re-read, "
    "or the session changed before the write"
)
VIEW_ONLY = "the API cannot change a message itself: its settlement stays in views"
_MESSAGE_PREFIX = "msg_"


def is_message(key: str) -> bool:
    """Whether a named id is a message's (a change to the message itself), not a part's or call's."""
    return key.startswith(_MESSAGE_PREFIX)


@dataclass(frozen=True, slots=True)
class Written:
    """One settled part (or message) made durable, for the log."""

    api: Api
    session_id: str
    message_id: str
    part: str | None
    """The part (v1) or call (v2) written; None for a change to the message itself."""
    rule: str

    @property
    def key(self) -> str:
        """The id the fetch named for it (`rules.Target.key`)."""
        return self.part or self.message_id


class WriteBackOutcome(StrEnum):
    """How the write-back of one named id ended."""

    WRITTEN = "written"
    """Made durable by this proxy."""
    SKIPPED = "skipped"
    """Not written: the session was active, the id no longer open when re-read (settled by
    someone else), not vouched for by the reading, or the proxy closed first; the log says which."""
    FAILED = "failed"
    """The pass failed (liveness unknown, or the writer raised): nothing was written."""
    UNKNOWN = "unknown"
    """Never named, or forgotten (only `OUTCOMES_KEPT` are remembered)."""


class Decisions:
    """Logs and remembers decisions, and wakes whoever awaits one."""

    def __init__(self, mode: str) -> None:
        self._mode = mode
        self._outcomes: Bounded[tuple[Api, str, str], WriteBackOutcome] = Bounded(OUTCOMES_KEPT)
        self._view_only: Bounded[tuple[Api, str, str], bool] = Bounded(OUTCOMES_KEPT)
        """The messages said once to be view only."""
        self._changed = asyncio.Event()

    def outcome(self, api: Api, session_id: str, key: str) -> WriteBackOutcome:
        return self._outcomes.get((api, session_id, key), WriteBackOutcome.UNKNOWN)

    async def changed(self) -> None:
        """Return at the next `announce()`."""
        await self._changed.wait()

    def announce(self) -> None:
        """Wake every `changed()` waiter: a pass has ended."""
        self._changed.set()
        self._changed = asyncio.Event()

    def written(self, written: Iterable[Written]) -> None:
        for item in written:
            fields = self._decide(item.api, item.session_id, item.key, WriteBackOutcome.WRITTEN, WRITTEN_WHY)
            fields |= {"message": item.message_id, "part": item.part, "rule": item.rule}
            log.info("wrote back %s", item.rule, extra={"fields": fields})

    def skipped(self, session: tuple[Api, str], keys: Collection[str], why: str) -> None:
        api, session_id = session
        for key in sorted(keys):
            fields = self._decide(api, session_id, key, WriteBackOutcome.SKIPPED, why)
            log.info("write-back of %s skipped: %s", session_id, why, extra={"fields": fields})
        self.announce()

    def view_only(self, session: tuple[Api, str], keys: Collection[str]) -> None:
        """`keys` (messages) are skipped: the API cannot change a message itself. Said once per
        message: a client fetching its view again and again names it again and again."""
        api, session_id = session
        new = set()
        for key in keys:
            if (api, session_id, key) in self._view_only:
                self._outcomes[(api, session_id, key)] = WriteBackOutcome.SKIPPED  # decided again, unsaid
            else:
                self._view_only[(api, session_id, key)] = True
                new.add(key)
        self.skipped(session, new, VIEW_ONLY)

    def failed(
        self, session: tuple[Api, str], keys: Collection[str], why: str, *, error: BaseException | None = None
    ) -> None:
        """One WARNING per id; the traceback of an unexpected error only once."""
        api, session_id = session
        for key in sorted(keys):
            fields = self._decide(api, session_id, key, WriteBackOutcome.FAILED, why)
            log.warning(
                "write-back of %s failed (mode=%s); nothing half-written: %s",
                session_id,
                self._mode,
                why,
                exc_info=error,
                extra={"fields": fields},
            )
            error = None

    def _decide(
        self, api: Api, session_id: str, key: str, outcome: WriteBackOutcome, why: str
    ) -> dict[str, Any]:
        """Remember the outcome; the fields of its log line."""
        self._outcomes[(api, session_id, key)] = outcome
        message = is_message(key)
        return {
            "session": session_id,
            "message": key if message else None,
            "part": None if message else key,
            "mode": str(self._mode),
            "api": str(api),
            "rule": None,
            "outcome": str(outcome),
            "why": why,
        }
