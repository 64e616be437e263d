"""Never a stampede: the continuations of one crash are admitted a few at a time, spaced, in the
order their turns were handed on (the order the stream last heard of them, so the order they were
cut). OpenWork admits one every 2 s, at most 2 at once; so does `--resume-concurrency 2
--resume-spacing 2`. A continuation holds its place from admission until its turn was seen to
start (or given up on), so a restarted server is asked to start at most `concurrency` turns at once."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

__all__ = ["Admission"]

DEFAULT_CONCURRENCY = 2
DEFAULT_SPACING_S = 2.0


class Admission:
    """Tickets taken in order (`ticket`), admitted in that order (`admitted`), each ticket given
    back when its turn is not continued after all (`drop`)."""

    def __init__(
        self,
        concurrency: int = DEFAULT_CONCURRENCY,
        spacing: float = DEFAULT_SPACING_S,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.concurrency = concurrency
        self.spacing = spacing
        self._clock = clock
        self._sleep = sleep
        self._numbers = itertools.count()
        self._waiting: set[int] = set()
        self._active = 0
        self._last: float | None = None
        self._changed = asyncio.Event()
        self._epoch = time.time() - clock()
        """The wall-clock time of `clock`'s zero: an admission's time said on `clock`, so that two
        said `spacing` apart are that far apart in the log too."""

    def ticket(self) -> int:
        number = next(self._numbers)
        self._waiting.add(number)
        return number

    def drop(self, ticket: int) -> None:
        """Give `ticket` back unused (a no-op once it was admitted): the next ones move up."""
        if ticket in self._waiting:
            self._waiting.discard(ticket)
            self._wake()

    @asynccontextmanager
    async def admitted(self, ticket: int) -> AsyncIterator[float]:
        """Wait until every earlier ticket was admitted or dropped, fewer than `concurrency` are
        in, and `spacing` seconds passed since the last admission; hold the place until exit.
        Yields the wall-clock time of the admission."""
        while True:
            if min(self._waiting) == ticket and self._active < self.concurrency:
                delay = 0.0 if self._last is None else self._last + self.spacing - self._clock()
                if delay <= 0:
                    break
                await self._sleep(delay)
                continue
            self._changed.clear()
            await self._changed.wait()
        self._waiting.discard(ticket)
        self._active += 1
        self._last = self._clock()
        self._wake()
        try:
            yield self._epoch + self._last
        finally:
            self._active -= 1
            self._wake()

    def _wake(self) -> None:
        self._changed.set()
