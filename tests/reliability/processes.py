"""What the kernel says about a process: open file descriptors and resident memory.

Leaks of connections, sockets or tasks show up here whatever their cause, which is why the
load and fault tests look at the proxy from the outside rather than at its objects.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path

_PROC = Path("/proc")


def open_fds(pid: int) -> int:
    """How many file descriptors `pid` holds right now (sockets, pipes, files)."""
    return len(os.listdir(_PROC / str(pid) / "fd"))


def rss_bytes(pid: int) -> int:
    """The resident set size of `pid` (VmRSS), in bytes."""
    for line in (_PROC / str(pid) / "status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


async def steady_fds(pid: int, *, within: float = 5.0, interval: float = 0.25) -> int:
    """The fd count once it has stopped changing: sockets a client just closed take a moment
    to be closed by the server too, and a baseline taken before that would hide a leak."""
    deadline = time.monotonic() + within
    count = open_fds(pid)
    while time.monotonic() < deadline:
        await asyncio.sleep(interval)
        count, previous = open_fds(pid), count
        if count == previous:
            break
    return count


async def eventually(check: Callable[[], bool], *, within: float = 10.0, interval: float = 0.05) -> bool:
    """Whether `check` becomes true within `within` seconds: a process closes the sockets and
    upstream requests a client left a moment after the client is gone."""
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(interval)
    return True
