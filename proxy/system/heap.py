"""The C heap, kept for the bodies the next request reads.

A message view is read whole (hundreds of KB to a few MB) and copied a few times per request.
glibc serves an allocation that large from the heap only once its adaptive threshold has grown
past it, and gives the top of the heap back to the kernel as soon as more than twice that
threshold is free, which a request that frees its bodies does every time: the next request then
faults every page of its bodies in again (measured on a 601 KB v1 list: ~150 page faults and
~40% of the proxy's CPU per request). Fixed thresholds keep what one request frees for the next.

What they keep is never given back by itself while less than `KEPT` is free at the top, and the
free pages below it never: through crash after crash the proxy grew by what each one's settling,
telling and resuming freed (measured in the memory soak: glibc's free heap from 1.7 to 4.7 MB in
six rounds while what was in use stayed at 12.8). A server that restarted is a moment without
the traffic those pages were kept for, so then they are given back (`malloc_trim`).
"""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
FROM_HEAP = 8 * 2**20
"""Allocations up to this size come from the heap (a 10,000-part list is 3.6 MB); a larger one
gets a mapping of its own, given back the moment it is freed."""
KEPT = 32 * 2**20
"""Free memory at the top of the heap kept rather than given back, at most."""


def keep_freed_bodies() -> bool:
    """Fix glibc's thresholds (`mallopt`); whether they were set (not on another C library)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    kept = bool(mallopt(M_MMAP_THRESHOLD, FROM_HEAP)) and bool(mallopt(M_TRIM_THRESHOLD, KEPT))
    log.debug("C heap thresholds %s", "set" if kept else "left as they are (not glibc)")
    return kept


def give_back_freed() -> bool:
    """Give the kernel every free page of the C heap (`malloc_trim(0)`: the top kept by `KEPT`,
    and whole free pages below it); whether any was given back (never, on another C library)."""
    try:
        malloc_trim = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):
        return False
    malloc_trim.argtypes, malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    return bool(malloc_trim(0))


class GiveBackOnRestart:
    """A stream listener (by its shape: `following` and `event`) that gives the heap's free pages
    back each time the server's stream is followed again: after a crash or a restart, the pages
    kept for the next request's bodies are a proxy's growth, one crash after another."""

    name = "give-back-on-restart"

    def following(self) -> None:
        given = give_back_freed()
        log.debug("free heap pages %s", "given back" if given else "none to give back")

    def event(self, event: object) -> None:
        """Events change nothing here."""
