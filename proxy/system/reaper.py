"""The processes a supervising proxy answers for: its server, and whatever the server leaves behind.

opencode's bash tool starts every command in a process group of its own, so when the server
dies its commands live on. Made a child subreaper (Linux `PR_SET_CHILD_SUBREAPER`), the proxy
becomes their parent instead of PID 1: it can see them, reap them and end them. The server it
starts is told to die with it (`PR_SET_PDEATHSIG`), so even a SIGKILL of the proxy leaves no
server running unsupervised. Elsewhere (macOS) neither exists: the functions say so and do nothing.

Adopted processes and the proxy's own children look the same (both have the proxy as parent),
and reaping one the proxy waits on itself takes its exit status from the waiter: asyncio then
reports 255, and under uvloop the wait never returns. So every child the proxy waits on is
started within `own_child()`, and no reap here ever touches it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator

from proxy.system.procfs import pids, stat, ticks_since_boot

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return bool(libc.prctl(option, value, 0, 0, 0) == 0)


def become_subreaper() -> bool:
    """Adopt the orphans of every descendant; False where the system cannot."""
    return _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def die_with_parent(parent: int) -> None:
    """Have this process SIGKILLed when `parent` dies, however it dies; exit if it already has."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)


def _start_of(pid: int) -> int | None:
    found = stat(pid)
    return found.started if found is not None else None


class _OwnChildren:
    """The children this process waits on itself, each by pid and start time (a pid the kernel
    hands out again is no longer one of them). A child being started has no pid yet: until it is
    kept, every child started since its start began is taken for it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: dict[int, int] = {}
        self._starting: list[int] = []

    @contextlib.contextmanager
    def starting(self) -> Iterator[Callable[[int], None]]:
        since = ticks_since_boot()
        with self._lock:
            self._starting.append(since)
        try:
            yield self._keep
        finally:
            with self._lock:
                self._starting.remove(since)

    def _keep(self, pid: int) -> None:
        started = _start_of(pid)
        with self._lock:
            self._kept = {known: at for known, at in self._kept.items() if _start_of(known) == at}
            if started is not None:
                self._kept[pid] = started

    def reap(self, pids: list[int]) -> None:
        with self._lock:
            for pid in pids:
                if not self.owns(pid):
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(pid, os.WNOHANG)

    def owns(self, pid: int) -> bool:
        started = _start_of(pid)
        if started is None:
            return False
        return self._kept.get(pid) == started or any(started >= since for since in self._starting)


_own_children = _OwnChildren()


def own_child() -> contextlib.AbstractContextManager[Callable[[int], None]]:
    """Around starting a child this process waits on itself: call what it gives with the child's
    pid once started; from then on no reap takes the child's exit status."""
    return _own_children.starting()


def adopted() -> list[int]:
    """The proxy's children other than its own (its server): processes the server left behind."""
    own = os.getpid()
    return [
        pid
        for pid in pids()
        if (found := stat(pid)) is not None and found.parent == own and not _own_children.owns(pid)
    ]


def reap(pids: list[int]) -> None:
    """Collect the exit status of adopted processes that have ended, so no zombie stays; a child
    of the proxy's own (or one being started) is left to whoever waits on it."""
    _own_children.reap(pids)


KILL_WAIT = 5.0
"""Seconds a SIGKILLed process is given to end and be reaped: on a loaded machine the kernel may
take a while to schedule its death, and a child not yet dead cannot be reaped."""


def end_groups(pids: list[int], grace: float) -> None:
    """SIGTERM the process group of each of `pids`, then SIGKILL what still runs after `grace` s.

    Synchronous on purpose: it runs at shutdown, after the event loop has nothing else to do.
    """
    groups = {group for pid in pids if (group := _group_of(pid)) is not None and group != os.getpgid(0)}
    _signal_groups(groups, signal.SIGTERM)
    groups = _reaped_within(groups, grace)
    _signal_groups(groups, signal.SIGKILL)
    _reaped_within(groups, KILL_WAIT)


def _reaped_within(groups: set[int], seconds: float) -> set[int]:
    """Reap the children of `groups` as they end, for up to `seconds`; the groups still running."""
    deadline = time.monotonic() + seconds
    while True:
        groups = {group for group in groups if _group_alive(group)}
        reap(adopted())  # after the look: one that ended before it is a zombie until reaped here
        if not groups or time.monotonic() >= deadline:
            return groups
        time.sleep(0.05)


def _signal_groups(groups: set[int], signum: int) -> None:
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signum)


def _group_alive(group: int) -> bool:
    """Whether any process of `group` still runs (a zombie is only waiting to be reaped)."""
    return any(
        (found := stat(pid)) is not None and found.group == group and found.state != "Z" for pid in pids()
    )


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None
