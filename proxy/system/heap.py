"""The C heap, kept for the bodies the next request reads.

A message view is read whole (hundreds of KB to a few MB) and copied a few times per request.
glibc serves an allocation that large from the heap only once its adaptive threshold has grown
past it, and gives the top of the heap back to the kernel as soon as more than twice that
threshold is free, which a request that frees its bodies does every time: the next request then
faults every page of its bodies in again (measured on a 601 KB v1 list: ~150 page faults and
~40% of the proxy's CPU per request). Fixed thresholds keep what one request frees for the next.

What is kept is given back once in a while (`give_back_every`): a request that needs more than
any before it (a write-back reading a log that grows with the database) moves the top of the
heap up, and freed chunks between the survivors of many such requests hold whole pages that only
`malloc_trim` returns. Measured over a soak's crashes: the heap's free memory grew ~0.4 MiB a
crash while what was in use stayed flat; trimmed every 30 s, it fell back to ~2 MiB each time.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import logging
from collections.abc import Callable
from typing import cast

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
FROM_HEAP = 8 * 2**20
"""Allocations up to this size come from the heap (a 10,000-part list is 3.6 MB); a larger one
gets a mapping of its own, given back the moment it is freed."""
KEPT = 32 * 2**20
"""Free memory at the top of the heap kept rather than given back, at most."""
GIVE_BACK_EVERY_S = 10.0
"""How often free pages go back to the kernel: a request after it faults its bodies in again
once (some 0.3 ms for a 601 KB list), and a trim takes ~1 ms (~20 ms for a 200 MB heap in
holes), both negligible once every 10 s."""


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


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return cast("Callable[[int], int]", trim)


def give_back_free_pages() -> bool:
    """Return every whole free page of the heap to the kernel (glibc's `malloc_trim(0)`, which also
    frees pages between chunks in use, not only the top); whether it could (not on another C
    library)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


async def give_back_every(interval: float = GIVE_BACK_EVERY_S) -> None:
    """Give free pages back every `interval` seconds, until cancelled (the proxy's whole life)."""
    if _malloc_trim() is None:
        log.debug("free heap pages are the C library's to give back (not glibc)")
        return
    while True:
        await asyncio.sleep(interval)
        give_back_free_pages()
