"""Bounded waiting: every wait in the harness ends, and says what it was waiting for."""

from __future__ import annotations

import time
from collections.abc import Callable
from email.utils import parsedate_to_datetime
from typing import TypeVar
from urllib.request import urlopen

from rules.liveness import FRESH_MARGIN_MS

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """A condition was not reached in time; an AssertionError so pytest shows it as a test failure."""


def poll(check: Callable[[], T | None], *, what: str, timeout: float, interval: float = 0.2) -> T:
    """Call `check` until it returns something other than None, and return that.

    Exceptions from `check` propagate: a broken server should fail loudly, not be retried into a
    confusing timeout. `check` itself must use bounded I/O so the deadline holds.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result is not None:
            return result
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def wait_past_freshness(server_url: str, since_ms: int) -> None:
    """Return once the server's own clock (its `Date`, whole seconds, read as the proxy reads it) is
    past `rules.liveness.FRESH_MARGIN_MS` after `since_ms`: a reading the proxy takes from then on
    vouches for anything last alive before `since_ms` (a crash), so a first fetch settles it."""

    def past() -> bool | None:
        with urlopen(server_url + "/global/health", timeout=5) as answer:
            date = parsedate_to_datetime(answer.headers["Date"])
        return True if int(date.timestamp()) * 1000 > since_ms + FRESH_MARGIN_MS else None

    poll(past, what="the server's clock past the freshness margin of the crash", timeout=10)
