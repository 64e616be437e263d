"""The C heap, kept for the bodies the next request reads.

A message view is read whole (hundreds of KB to a few MB) and copied a few times per request.
glibc serves an allocation that large from the heap only once its adaptive threshold has grown
past it, and gives the top of the heap back to the kernel as soon as more than twice that
threshold is free, which a request that frees its bodies does every time: the next request then
faults every page of its bodies in again (measured on a 601 KB v1 list: ~150 page faults and
~40% of the proxy's CPU per request). Fixed thresholds keep what one request frees for the next.
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
