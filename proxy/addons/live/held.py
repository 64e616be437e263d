"""Confirmations another process on the database held back, made again once it is gone.

A confirmation reads the message and a liveness reading bounded by the other processes holding
the server's database (`opencode export`, a sqlite3 shell, a second opencode): what was alive
after the earliest of them started may be running there, so the rules leave it open. Such a
process is often short-lived, and once it exits the same view is settled on its next fetch; but
nothing would make a client stream that saw the call open be told, as the followed stream says
nothing more of the session. So a call the bound alone held back is remembered, the bound is
asked again with growing pauses (each a cheap survey, reused while fresh), and once it has moved
past (that process exited) the confirmation is made again, in full: the grace, a fresh read, a
fresh reading. Each decision is said in the log.

A reading taken too shortly after a call's last sign of life holds it back as well (the rules'
`FRESH_MARGIN_MS`: an announcement of its turn may still be in flight): with a short grace it can
be the first reading after a restart, and nothing else would ask again. Such a call is confirmed
again once the margin has passed. `Holds` says which of the two left a call open.

A wait is not work under way: `idle` does not wait for it (the process may run for hours), and
`close` cancels it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from proxy.opencode.liveness import LivenessProbe
from rules import FRESH_MARGIN_MS, Liveness

log = logging.getLogger(__name__)

PAUSES_S = (0.5, 0.5, 1.0, 1.0, 2.0, 5.0)
"""Between two looks at the bound; the last is repeated for as long as the process holds on."""


@dataclass(frozen=True, slots=True)
class Holds:
    """Of the calls a reading left open, those a later one may settle, and what held each back."""

    bound: frozenset[str]
    """Only the bound of another process on the database holds them: confirmed once it exits."""
    recent: frozenset[str]
    """Only the reading's recency holds them: confirmed again once the margin has passed."""

    @staticmethod
    def of(settles: Callable[[Liveness], set[str]], liveness: Liveness) -> Holds:
        """What held back each call `settles(reading)` (the calls a reading settles) leaves open
        under `liveness`; an active session holds everything, and nothing here."""
        if liveness.active:
            return Holds(frozenset(), frozenset())
        now = settles(liveness)
        later = replace(liveness, taken_at=None)
        settled_later = settles(later) if liveness.taken_at is not None else now
        free = settles(replace(later, elsewhere_since=None)) if liveness.elsewhere_since else settled_later
        return Holds(frozenset(free - settled_later), frozenset(settled_later - now))

    @property
    def calls(self) -> frozenset[str]:
        return self.bound | self.recent


class HeldBack:
    """Per session, at most one wait for the process whose start bounds its readings to exit."""

    def __init__(self, probe: LivenessProbe, what: str) -> None:
        self._probe = probe
        self._what = what
        self._waits: dict[str, asyncio.Task[None]] = {}

    def wait(self, session_id: str, bound: int, again: Callable[[], None], still: Callable[[], bool]) -> None:
        """Call `again()` once readings of `session_id` are no longer bounded at `bound` (or
        earlier), while `still()` says there is something left to confirm."""
        log.info(
            "live settle of %s: %s left open, another process on the server's database (started %s) "
            "may run them; confirmed again once it exits",
            session_id,
            self._what,
            _when(bound),
            extra={"fields": {"session": session_id, "bound": bound, "decision": "held back"}},
        )
        self._start(session_id, self._wait(session_id, bound, again, still))

    def hold(
        self,
        session_id: str,
        holds: Holds,
        liveness: Liveness,
        again: Callable[[], None],
        still: Callable[[], bool],
    ) -> None:
        """Call `again()` once what `holds` says held calls of `session_id` back is gone: the margin
        first (the confirmation then made may find the bound), else the bound."""
        if holds.recent:
            self._start(session_id, self._recent(session_id, again, still))
        elif holds.bound and liveness.elsewhere_since is not None:
            self.wait(session_id, liveness.elsewhere_since, again, still)

    def _start(self, session_id: str, waited: Coroutine[None, None, None]) -> None:
        if (waiting := self._waits.get(session_id)) is not None and not waiting.done():
            waited.close()
            return
        task = asyncio.create_task(waited, name=f"held back {session_id}")
        self._waits[session_id] = task
        task.add_done_callback(lambda done: self._ended(session_id, done))

    async def _recent(self, session_id: str, again: Callable[[], None], still: Callable[[], bool]) -> None:
        log.info(
            "live settle of %s: %s left open, alive too shortly before the reading; confirmed again "
            "in %.0f s",
            session_id,
            self._what,
            FRESH_MARGIN_MS / 1000,
            extra={"fields": {"session": session_id, "decision": "too recent"}},
        )
        await asyncio.sleep(FRESH_MARGIN_MS / 1000)
        if still():
            again()

    async def _wait(
        self, session_id: str, bound: int, again: Callable[[], None], still: Callable[[], bool]
    ) -> None:
        for attempt in itertools.count():
            await asyncio.sleep(PAUSES_S[min(attempt, len(PAUSES_S) - 1)])
            if not still():
                return
            try:
                now = (await self._probe.bounded(Liveness(session_id, active=False))).elsewhere_since
            except OSError:  # a survey that could not be taken says nothing: look again
                continue
            if now is None or now > bound:
                log.info(
                    "live settle of %s: the process that held it back is gone; confirming again",
                    session_id,
                    extra={"fields": {"session": session_id, "bound": now, "decision": "confirm again"}},
                )
                again()
                return

    def _ended(self, session_id: str, task: asyncio.Task[None]) -> None:
        if self._waits.get(session_id) is task:
            del self._waits[session_id]
        if not task.cancelled() and (error := task.exception()) is not None:
            log.error("waiting for a holder of the database, for %s, failed: %r", session_id, error)

    @property
    def busy(self) -> bool:
        """Never: a wait for a process to exit is not work under way."""
        return False

    async def idle(self) -> None:
        """Nothing to wait for (see `busy`)."""

    async def close(self) -> None:
        """Cancel every wait (application cleanup)."""
        for task in self._waits.values():
            task.cancel()
        for task in list(self._waits.values()):
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _when(epoch_ms: int) -> str:
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).strftime("%H:%M:%S UTC")
