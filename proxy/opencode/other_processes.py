"""Other processes on the upstream's database: since when a tool may run where liveness can't see.

Liveness is per process: a tool running in a second opencode (another `opencode serve`, or
the server a plain `opencode` TUI runs inside itself) on the same `opencode.db` is absent from
the upstream's liveness views while both show it running. But a tool can only run in a
process that already existed when the tool started, so on one host there is an exact test:
a message last alive before the start of every other live process holding the database
cannot be running in any of them.

A survey finds the upstream's process (the one listening on the upstream's loopback port),
the `opencode*.db` it holds open, and every other process holding that file, with their
start times. One pass over `/proc` does it all. The database is told by device and inode: a
second server may reach the same file by another path (a hard link, a bind mount, another mount
namespace), and it is the same database. Linux only; where it cannot be known (no
`/proc`, an upstream on another host or in another network namespace, processes of other
users) the survey says why, and the caller says so once and settles as before.

Processes of settle-proxy itself (a `--write-back db` proxy, the offline command) run no
tools: they mark themselves with a memfd named `MARKER`, which shows in their fd table as
`/memfd:settle-proxy (deleted)` and cannot be mistaken for anything opencode opens.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from yarl import URL

from proxy.system.open_files import (
    File,
    FileId,
    OpenFiles,
    boot_time_ms,
    listening_sockets,
    open_files,
    started_at_ms,
)
from proxy.system.procfs import PROC, command_line, program_name

log = logging.getLogger(__name__)

MARKER = "settle-proxy"
START_MARGIN_MS = 1_000
"""Start times are taken this much earlier than `/proc` says: the boot time it gives follows
wall-clock steps made since boot, and an early bound can only hold back, never settle wrongly."""
_marker_fd: int | None = None


def mark_this_process() -> None:
    """Let surveys of other settle-proxy processes know this one runs no tools (idempotent)."""
    global _marker_fd  # noqa: PLW0603 - one mark per process, for its whole life
    if _marker_fd is None and hasattr(os, "memfd_create"):
        with contextlib.suppress(OSError):
            _marker_fd = os.memfd_create(MARKER)


@dataclass(frozen=True, slots=True)
class OtherProcess:
    """A live process other than the upstream's holding the database."""

    pid: int
    started_at: int
    """Epoch ms, erring early by `START_MARGIN_MS`."""
    command: str
    database: str
    """The path it holds the database by, as its own mount namespace names it."""


@dataclass(frozen=True, slots=True)
class Survey:
    """What one pass over `/proc` found, at `scanned_at` (epoch ms, taken before the pass)."""

    scanned_at: int
    unknown: str | None = None
    """Why no bound can be given; None when the survey is complete enough to give one."""
    upstream_pids: tuple[int, ...] = ()
    databases: tuple[str, ...] = ()
    others: tuple[OtherProcess, ...] = ()
    not_inspected: int = 0
    """Processes whose open files could not be read (other users'): a blind spot."""
    listeners: tuple[str, ...] = ()
    """Inodes of the sockets listening on the upstream's port, for the next survey."""
    final: bool = False
    """Whether no later survey can say otherwise (no `/proc`, an upstream off this host's loopback)."""
    passing: bool = False
    """Whether `unknown` is of the moment: nothing listens on the upstream's port yet (a server
    starting, or restarting under `run`). Shown in health, never warned about: the next survey knows."""

    @property
    def bound(self) -> int | None:
        """`Liveness.elsewhere_since`: nothing alive at or after it is known to be dead.

        A process started after the survey is not in it, so the survey's own time bounds too.
        """
        if self.unknown is not None:
            return None
        return min([self.scanned_at, *(other.started_at for other in self.others)])

    def describe(self) -> dict[str, Any]:
        """The health section."""
        body: dict[str, Any] = {"known": self.unknown is None, "scanned_at": self.scanned_at}
        if self.unknown is not None:
            body["why"] = self.unknown
        body |= {
            "upstream_pids": list(self.upstream_pids),
            "databases": list(self.databases),
            # The program's name only: a command line may hold what a client of the proxy should not see.
            "others": [
                {"pid": other.pid, "started_at": other.started_at, "program": program_name(other.command)}
                for other in self.others
            ],
            "not_inspected": self.not_inspected,
        }
        return body


def survey(
    upstream: URL,
    *,
    database: Path | None = None,
    proc: Path | None = None,
    own_pid: int | None = None,
    now_ms: int | None = None,
    listeners: tuple[str, ...] = (),
    accepts: Callable[[URL], bool] | None = None,
) -> Survey:
    """Survey the processes around `upstream`'s database (blocking; run it in a thread).

    `database` names the file when the caller already knows it (the offline command); the
    upstream's process is then optional: unidentified, every holder counts as another.
    `listeners` are the socket inodes an earlier survey found listening on the upstream's port;
    `accepts` says whether something accepts connections there (default: `accepting`).
    """
    scanned_at = int(time.time() * 1000) if now_ms is None else now_ms
    proc = PROC if proc is None else proc
    try:
        boot_ms = boot_time_ms(proc)
    except (OSError, ValueError):
        return Survey(
            scanned_at, unknown=f"no readable {proc}/stat: not Linux, or /proc is not mounted", final=True
        )
    if database is None and not _on_loopback(upstream):
        return Survey(
            scanned_at,
            unknown=f"the upstream {upstream.origin()} is not on this host's loopback "
            "(another host or container?)",
            final=True,
        )
    seen, not_inspected = open_files(proc, f"/memfd:{MARKER} (deleted)")
    held = {socket for process in seen.values() for socket in process.sockets}
    # Reading the socket tables costs more than the whole fd pass: the last answer holds while
    # its socket is still open.
    listening = set(listeners) & held or _listening(proc, upstream)
    if database is None and not listening:
        return _listening_nowhere(scanned_at, proc, upstream, accepts)
    upstream_pids = tuple(sorted(pid for pid, process in seen.items() if process.sockets & listening))
    found = _databases(upstream, database, seen, upstream_pids, not_inspected)
    if isinstance(found, str):
        return Survey(scanned_at, unknown=found, upstream_pids=upstream_pids, not_inspected=not_inspected)
    ours = {os.getpid() if own_pid is None else own_pid, *upstream_pids}
    return Survey(
        scanned_at,
        upstream_pids=upstream_pids,
        databases=tuple(sorted(set(found.values()))),
        listeners=tuple(sorted(listening)),
        others=_others(proc, boot_ms, seen, found, ours),
        not_inspected=not_inspected,
    )


def _others(
    proc: Path, boot_ms: int, seen: dict[int, OpenFiles], found: dict[File, str], ours: set[int]
) -> tuple[OtherProcess, ...]:
    """The processes that hold one of the `found` databases, but for `ours` and marked proxies."""
    others = []
    for pid, process in sorted(seen.items()):
        shared = sorted(process.databases[file] for file in process.databases.keys() & found.keys())
        if pid in ours or process.marked or not shared:
            continue
        started = started_at_ms(proc, pid, boot_ms)
        if started is not None:
            others.append(OtherProcess(pid, started - START_MARGIN_MS, command_line(pid, proc), shared[0]))
    return tuple(others)


def _databases(
    upstream: URL,
    database: Path | None,
    seen: dict[int, OpenFiles],
    upstream_pids: tuple[int, ...],
    not_inspected: int,
) -> dict[File, str] | str:
    """The database files the survey is about, each with its path: `database`, else the opencode
    databases the upstream's process holds open; or why they cannot be known."""
    if database is not None:
        path = str(database.resolve())
        return {FileId.of(path) or path: path}
    if not upstream_pids:
        why = "(another user's?)" if not_inspected else "(another container?)"
        return f"the process listening on {upstream.origin()} is not among those readable here {why}"
    databases = {
        file: path
        for pid in upstream_pids
        for file, path in seen[pid].databases.items()
        if os.path.basename(path).startswith("opencode")
    }
    if not databases:
        return (
            f"the process listening on {upstream.origin()} "
            f"(pid {', '.join(map(str, upstream_pids))}) holds no opencode database open"
        )
    return databases


def _on_loopback(upstream: URL) -> bool:
    return is_loopback(upstream.host or "") and upstream.port is not None


ACCEPT_TIMEOUT_S = 0.5
"""How long a survey waits for the upstream's port to accept a connection (loopback: at once)."""


def accepting(upstream: URL) -> bool:
    """Whether something accepts a connection on the upstream's address; only connected, never
    asked anything (opencode can hang on a request sent the instant its port opens)."""
    try:
        with socket.create_connection((upstream.host or "", upstream.port or 0), timeout=ACCEPT_TIMEOUT_S):
            return True
    except OSError:
        return False


def _listening_nowhere(
    scanned_at: int, proc: Path, upstream: URL, accepts: Callable[[URL], bool] | None
) -> Survey:
    """No socket seen here listens on the upstream's port. That is another network namespace only
    if something accepts there all the same; when nothing does, the server is not listening yet
    (it is starting), which the next survey will see. Asked after the tables were read, so one
    that began listening in between is read again rather than called another container's."""
    origin = upstream.origin()
    if not (accepts or accepting)(upstream):
        return Survey(scanned_at, unknown=f"nothing listens on the upstream {origin} yet", passing=True)
    if _listening(proc, upstream):
        return Survey(
            scanned_at, unknown=f"the upstream {origin} began listening during the survey", passing=True
        )
    return Survey(
        scanned_at, unknown=f"the upstream {origin} listens in no socket seen here (another container?)"
    )


def _listening(proc: Path, upstream: URL) -> set[str]:
    """Inodes of the sockets listening on the upstream's port (none unless it is on loopback)."""
    if not _on_loopback(upstream) or upstream.port is None:
        return set()
    return listening_sockets(proc, upstream.port)


def is_loopback(host: str) -> bool:
    """Whether `host` (a name, or an address, IPv6 in brackets or not) is this machine's loopback."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
