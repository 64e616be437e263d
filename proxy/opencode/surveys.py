"""Surveys of the other processes on the upstream's database, reused while they vouch.

A survey taken after a message's last sign of life vouches for that message for good: a process
started later cannot be running its tool, and one that has ended since only made the bound
earlier. So a survey whose bound is past all that a reading could call dead is as good as any
later one for that reading, and is reused however old; any other is reused for `MAX_AGE_S` (a
holder that ended must stop holding settlements back) and retaken in the background before then
while it is still asked for. A request waits for a survey only when none vouches for it and the
last one expired: the /proc pass (some 40 ms on a loaded 2-core machine) stays off the request path.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

from yarl import URL

from proxy.opencode import other_processes
from proxy.opencode.other_processes import Survey

log = logging.getLogger(__name__)

MAX_AGE_S = 1.0
"""How long a survey that does not vouch for what a reading asks is reused (one that does is
reused for good). Folding its time into the bound keeps a reused one exact."""
REFRESH_AT = 0.8
"""The part of `MAX_AGE_S` after which a survey still reused is retaken in the background, so that
a proxy asked steadily has a fresh one before the old one expires and no request waits for it."""


class OtherProcesses:
    """Surveys, reused while they vouch and refreshed in the background; says once in the log
    what it cannot know."""

    def __init__(
        self, upstream: URL, *, database: Path | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self._upstream = upstream
        self._database = database
        self._clock = clock
        self._last: Survey | None = None
        self._surveying: asyncio.Task[Survey] | None = None
        self._said: set[str] = set()

    async def bound(self, vouches: Callable[[int], bool] | None = None) -> int | None:
        """`Liveness.elsewhere_since` for a reading taken now; `vouches(bound)` says whether a
        survey with that bound already vouches for all the reading could call dead (None: no
        survey vouches for good)."""
        last = self._last
        # A clock stepped back since the survey could make a process started since look older.
        age_ms = -1.0 if last is None else self._clock() * 1000 - last.scanned_at
        if last is not None and age_ms >= 0:
            if vouches is not None and last.bound is not None and vouches(last.bound):
                return last.bound
            if last.final or age_ms < MAX_AGE_S * 1000:
                if not last.final and age_ms >= REFRESH_AT * MAX_AGE_S * 1000:
                    self._refresh()
                return last.bound
        return (await self._fresh()).bound

    async def current(self) -> Survey:
        """A survey at most `MAX_AGE_S` old."""
        last = self._last
        if last is not None and self._clock() * 1000 - last.scanned_at < MAX_AGE_S * 1000:
            return last
        return await self._fresh()

    @property
    def busy(self) -> bool:
        return self._surveying is not None

    async def idle(self) -> None:
        """Wait until no survey is under way."""
        if self._surveying is not None:
            await asyncio.gather(self._surveying, return_exceptions=True)

    async def close(self) -> None:
        """Wait for a survey under way (application cleanup)."""
        await self.idle()

    async def _fresh(self) -> Survey:
        # Shielded: a request that goes away must not cancel the survey others wait for.
        return await asyncio.shield(self._refresh())

    def _refresh(self) -> asyncio.Task[Survey]:
        """The survey under way, or a new one (one at a time, whoever asks)."""
        if self._surveying is None:
            self._surveying = asyncio.create_task(self._survey(), name="other-processes survey")
        return self._surveying

    async def _survey(self) -> Survey:
        try:
            listeners = self._last.listeners if self._last else ()
            found = await asyncio.to_thread(
                other_processes.survey,
                self._upstream,
                database=self._database,
                listeners=listeners,
                now_ms=int(self._clock() * 1000),
            )
            self._tell(found)
            self._last = found
            return found
        finally:
            self._surveying = None

    def _tell(self, found: Survey) -> None:
        if found.unknown is not None and not found.passing:
            self._once(
                "unknown",
                "cannot tell whether another opencode process shares the upstream's database: "
                f"{found.unknown}; tools running in such a process would be shown settled",
            )
        if found.not_inspected:
            self._once(
                "not inspected",
                f"{found.not_inspected} processes of other users cannot be inspected: an opencode of theirs "
                "on this database would not be seen",
            )
        before = {other.pid for other in self._last.others} if self._last else set()
        for other in found.others:
            if other.pid not in before:
                log.info(
                    "pid %d also holds %s (as %s): what was alive after its start is never settled (%s)",
                    other.pid,
                    ", ".join(found.databases),
                    other.database,
                    other.command[:80],
                    extra={"fields": {"pid": other.pid, "database": other.database}},
                )

    def _once(self, topic: str, message: str) -> None:
        if topic not in self._said:
            self._said.add(topic)
            log.warning("%s", message)
