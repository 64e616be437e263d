"""Landing a SIGKILL inside a writer's write transaction, not merely between two: the writer is
frozen, sampled and killed while it holds SQLite's WAL write lock with part of its pass committed
(the why and the measurements: the docstring of tests/integration/test_write_back_faults.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .faults import PASS_TIMEOUT_S, REQUEST_TIMEOUT_S, Stored, fetch_messages, read_stored, state_of
from .http_client import Reply
from .opencode_server import REPO_ROOT, OpencodeServer
from .polling import WaitTimeout
from .proxy_process import ProxyProcess
from .settle_cli import environment, settle_command
from .turns import Observed

SAMPLE_INTERVAL_S = 0.0001
WRITER_NICE = 19
"""How long the writer runs between two samples: short against a transaction, so that most
transactions are caught at least once (reading storage at each sample takes longer)."""
KILL_ROUND_TIMEOUT_S = 20.0
SAMPLE_READ_TIMEOUT_S = 0.2
PROCESS_TIMEOUT_S = 10.0
WAL_WRITE_LOCK_BYTE = 120
"""SQLite's WAL_WRITE_LOCK in the -shm file: held from `BEGIN IMMEDIATE` to commit or rollback."""


class KillableProxy(ProxyProcess):
    """A proxy process the test can freeze and SIGKILL by its pid."""

    @property
    def pid(self) -> int:
        if self._process is None:
            raise RuntimeError("proxy is not running")
        return self._process.pid

    def kill(self) -> None:
        """SIGKILL (it works on a frozen process too) and reap it."""
        if self._process is not None:
            self._process.kill()
            self._process.wait(timeout=PROCESS_TIMEOUT_S)

    def thaw_and_stop(self) -> None:
        """Continue it in case a sample left it frozen, then stop it; idempotent."""
        if self._process is not None and self._process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._process.pid, signal.SIGCONT)
        self.stop()


def _all_threads_stopped(pid: int) -> bool | None:
    """True once every thread of `pid` is stopped; None when the process is gone."""
    tasks = Path(f"/proc/{pid}/task")
    try:
        names = list(tasks.iterdir())
    except FileNotFoundError:
        return None
    for task in names:
        try:
            stat = (task / "stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended
        state = stat[stat.rindex(")") + 2]
        if state in "ZX" and task.name == str(pid):
            return None  # the process has exited
        if state not in "tTZX":  # an exited thread runs nothing either
            return False
    return True


def freeze(pid: int) -> bool:
    """SIGSTOP and wait until every thread has stopped; False when the process is gone."""
    try:
        os.kill(pid, signal.SIGSTOP)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + PROCESS_TIMEOUT_S
    while (stopped := _all_threads_stopped(pid)) is False:
        if time.monotonic() > deadline:
            raise RuntimeError(f"process {pid} did not stop")
        time.sleep(0.0002)
    return stopped is True


def _lock_id(database: Path) -> tuple[int, int]:
    """(device, inode) of `opencode.db-shm`, as /proc/locks names it."""
    status = os.stat(f"{database}-shm")
    return status.st_dev, status.st_ino


def _holds_wal_write_lock(pid: int, shm: tuple[int, int]) -> bool:
    """Whether `pid` holds SQLite's WAL write lock on the database, i.e. is inside a write
    transaction (/proc/locks: `N: POSIX ADVISORY WRITE pid maj:min:inode start end`)."""
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if len(fields) < 8 or fields[1] != "POSIX" or fields[3] != "WRITE" or fields[4] != str(pid):
            continue
        major, minor, inode = fields[5].split(":")
        same_file = (os.makedev(int(major, 16), int(minor, 16)), int(inode)) == shm
        if same_file and int(fields[6]) == WAL_WRITE_LOCK_BYTE:
            return True
    return False


@dataclass(frozen=True)
class Kill:
    """How one attempt to SIGKILL a writer mid-pass went.

    Every sample freezes the writer, and what is committed while it is frozen is exactly what
    a SIGKILL at that instant would leave (SQLite discards the open transaction): so each
    sample is a crash point whose storage is checked, and the real SIGKILL at the end proves
    that equivalence on the last one.
    """

    landed: bool
    """Killed while inside a write transaction, with part of the pass committed."""
    committed: int
    """Sessions of the pass committed when it was killed (or when it ended unkilled)."""
    samples: int
    """Crash points checked: frozen samples whose committed storage was classified."""
    torn_while_frozen: dict[str, str]
    """Sessions seen neither old nor settled at some sample (the first such state seen)."""
    at_kill: dict[str, Stored] | None
    """The targets' storage read while frozen, right before the SIGKILL."""


@contextlib.contextmanager
def _writer_behind_sampler(pid: int) -> Iterator[None]:
    """Let the writer run only while the sampler sleeps: on the sampler's CPU, at the lowest
    priority (threads it starts later inherit both). Otherwise, on a busy machine, the sampler
    is scheduled late and the writer runs a whole pass between two samples (seen: nine
    sessions settled unobserved); the sampler's short sleeps now bound each run of it."""
    own = os.sched_getaffinity(0)
    cpu = {min(own)}
    os.sched_setaffinity(0, cpu)  # the calling thread only
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(ProcessLookupError):
                os.setpriority(os.PRIO_PROCESS, int(task.name), WRITER_NICE)
                os.sched_setaffinity(int(task.name), cpu)
        yield
    finally:
        os.sched_setaffinity(0, own)


def kill_mid_pass(
    pid: int, kill: Callable[[], None], database: Path, targets: list[Observed], before: dict[str, Stored]
) -> Kill:
    """Sample the writer frozen until it is inside a write transaction with part of the pass
    committed, and SIGKILL it right there; give up when the pass is over."""
    with _writer_behind_sampler(pid):
        return _sample_and_kill(pid, kill, database, targets, before)


def _sample_and_kill(
    pid: int, kill: Callable[[], None], database: Path, targets: list[Observed], before: dict[str, Stored]
) -> Kill:
    shm = _lock_id(database)
    samples, busy, torn = 0, 0, dict[str, str]()
    deadline = time.monotonic() + KILL_ROUND_TIMEOUT_S
    while time.monotonic() < deadline:
        frozen = freeze(pid)
        try:
            stored = read_stored(database, targets, busy_timeout=SAMPLE_READ_TIMEOUT_S)
        except sqlite3.OperationalError as error:
            # A reader can need a lock the frozen writer holds (it was stopped in the middle of
            # updating the WAL index): let it run on, and sample again.
            if "locked" not in str(error) and "busy" not in str(error):
                raise
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
            busy += 1
            time.sleep(SAMPLE_INTERVAL_S)
            continue
        samples += frozen
        for stale in targets:
            state = state_of(stale, before[stale.session_id], stored[stale.session_id])
            if state not in ("old", "settled"):
                torn.setdefault(stale.session_id, state)
        committed = sum(stored[s.session_id].last_seq > before[s.session_id].last_seq for s in targets)
        if not frozen or committed == len(targets):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
            return Kill(False, committed, samples, torn, None)
        if committed >= 1 and _holds_wal_write_lock(pid, shm):
            kill()
            return Kill(True, committed, samples, torn, stored)
        os.kill(pid, signal.SIGCONT)
        time.sleep(SAMPLE_INTERVAL_S)
    raise WaitTimeout(
        f"the writer neither finished nor was caught mid-pass in {KILL_ROUND_TIMEOUT_S}s "
        f"({samples} samples, {busy} unreadable while frozen)"
    )


def kill_proxy(server: OpencodeServer, targets: list[Observed], before: dict[str, Stored], log: Path) -> Kill:
    """A db proxy with no grace: every session fetched at once schedules its pass at once."""
    proxy = KillableProxy(
        server.url, log, ("--write-back", "db", "--db", str(server.database), "--grace", "0")
    )
    pool = ThreadPoolExecutor(max_workers=len(targets))
    fetches: list[Future[Reply]] = []
    try:
        proxy.start()
        fetches = [pool.submit(fetch_messages, proxy.url, s.turn) for s in targets]
        return kill_mid_pass(proxy.pid, proxy.kill, server.database, targets, before)
    finally:
        proxy.thaw_and_stop()
        for fetch in fetches:  # a fetch cut by the kill fails; that is the point
            with contextlib.suppress(Exception):
                fetch.result(timeout=REQUEST_TIMEOUT_S)
        pool.shutdown(wait=True)


def kill_settle(
    server: OpencodeServer, targets: list[Observed], before: dict[str, Stored], log: Path
) -> Kill:
    """`settle --upstream` as a user runs it next to a live server: it settles every inactive
    session in turn, one transaction each."""
    with log.open("ab") as output:
        process = subprocess.Popen(
            settle_command(server.database, "--upstream", server.url),
            cwd=REPO_ROOT,
            env=environment(),
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        return kill_mid_pass(process.pid, process.kill, server.database, targets, before)
    finally:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGCONT)
        try:
            process.wait(timeout=PASS_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=PROCESS_TIMEOUT_S)
