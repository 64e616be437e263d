"""Bounded waiting: every wait in the harness ends, and says what it was waiting for."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

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
