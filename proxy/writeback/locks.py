"""Cross-process locks per session, so that proxies sharing a server write a v1 part once.

v1's PATCH is a plain upsert (no version, no precondition): two proxies in front of one
server that both read a part before either writes it would both PATCH it (measured on
1.18.33: 15 of 20 trials wrote twice). Holding the session's lock across the re-read and
the PATCH makes the second writer read after the first has written. The lock is an `flock`
on a file every proxy of the user on the host finds at the same path; the kernel drops the
lock of a process that dies (SIGKILL included), so no stale lock ever blocks a later pass.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import stat
import tempfile
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

try:
    import fcntl
except ImportError:  # native Windows has no flock: one proxy per server there (see SessionLocks)
    fcntl = None  # type: ignore[assignment]

LOCK_STRIPES = 64
"""Lock files per directory: sessions share them by hash, so the directory never grows."""
LOCK_WAIT_S = 10.0
_LOCK_POLL_S = 0.02


def default_lock_dir(environ: Mapping[str, str]) -> Path:
    """Where every proxy of this user on this host looks for the v1 write locks, in `environ`.

    `$XDG_RUNTIME_DIR` is per user, private and cleared at logout, made for such files;
    without it, a per-user directory in the temporary directory.
    """
    runtime = environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "settle-proxy"
    return Path(tempfile.gettempdir()) / f"settle-proxy-{os.getuid()}"


class LockTimeout(TimeoutError):
    """Another writer held a session's lock for longer than a write-back should take."""


class SessionLocks:
    """Mutual exclusion of v1 writers across processes: `flock` on a shared lock file.

    A session maps to one of `LOCK_STRIPES` files by a stable hash (Python's `hash()` differs
    between processes), so two sessions may share a lock: they are then written one after
    the other, which costs nothing worth counting. Each hold opens the file anew, so holds
    exclude each other inside one process too. Waiting polls a non-blocking `flock`, which
    keeps the event loop free, and gives up after `wait` seconds (`LockTimeout`: nothing is
    written then; a later fetch tries again). Without `flock` (native Windows) a hold is a
    no-op, which is how every write behaved before: exactly once within one process only.
    """

    def __init__(self, directory: Path, *, wait: float = LOCK_WAIT_S) -> None:
        self._directory = directory
        self._wait = wait

    @asynccontextmanager
    async def hold(self, session_id: str) -> AsyncIterator[None]:
        """The session's lock for the duration of the block."""
        if fcntl is None:  # no flock here: exactly-once holds only within this process
            yield
            return
        descriptor = os.open(self._path(session_id), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            await self._acquire(descriptor, session_id)
            yield
        finally:
            os.close(descriptor)  # closing the only descriptor releases the lock

    async def _acquire(self, descriptor: int, session_id: str) -> None:
        deadline = time.monotonic() + self._wait
        while True:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LockTimeout(f"{session_id}: the write lock was held for {self._wait}s") from None
            await asyncio.sleep(_LOCK_POLL_S)

    def _path(self, session_id: str) -> Path:
        """The session's lock file, in a directory only this user may use (else refuse: another
        user could otherwise hold our locks, or point them elsewhere)."""
        directory = self._directory
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        status = directory.lstat()
        if not stat.S_ISDIR(status.st_mode) or status.st_uid != os.getuid():
            raise PermissionError(f"{directory} is not a directory of this user; not writing")
        stripe = int.from_bytes(hashlib.sha256(session_id.encode()).digest()[:4], "big") % LOCK_STRIPES
        return directory / f"v1-{stripe:02d}.lock"
