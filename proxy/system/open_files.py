"""Who holds what open, from every process's `/proc/PID/fd`, and who listens on a port, from
`/proc/net/tcp{,6}`: what a survey of the processes around a database reads, in one pass.

Every reader takes the `/proc` root (a test's fake tree, else /proc). A process whose fd table
cannot be read (another user's) is counted, never guessed at; one that ended meanwhile, or a
kernel thread (it holds no files), hides nothing and is not.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from proxy.system.procfs import stat

PF_KTHREAD = 0x00200000
_LISTEN = "0A"


@dataclass(slots=True)
class OpenFiles:
    """What one process's fd table says, reduced to what a survey needs."""

    sockets: set[str] = field(default_factory=set)
    """Inodes of its sockets."""
    databases: set[str] = field(default_factory=set)
    """Paths of the `*.db` files it holds open."""
    marked: bool = False
    """Whether it holds the marker link a survey was asked to look for."""


def open_files(proc: Path, marker: str) -> tuple[dict[int, OpenFiles], int]:
    """Every readable process's sockets, `*.db` files and whether one of its descriptors points
    at `marker`; and how many processes could not be read."""
    seen: dict[int, OpenFiles] = {}
    not_inspected = 0
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        links = fd_links(entry / "fd")
        if links is None:
            not_inspected += not _gone_or_kernel(proc, int(entry.name))
            continue
        process = seen[int(entry.name)] = OpenFiles()
        for link in links:
            if link.startswith("socket:["):
                process.sockets.add(link[8:-1])
            elif link.endswith(".db"):
                process.databases.add(link)
            elif link == marker:
                process.marked = True
    return seen, not_inspected


def listening_sockets(proc: Path, port: int) -> set[str]:
    """Inodes of the TCP sockets (v4 and v6) listening on `port`."""
    inodes: set[str] = set()
    hex_port = f":{port:04X}"
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            if f"{hex_port} " not in line:  # most lines, cheaply
                continue
            fields = line.split()
            if len(fields) > 9 and fields[3] == _LISTEN and fields[1].endswith(hex_port):
                inodes.add(fields[9])
    return inodes


def boot_time_ms(proc: Path) -> int:
    """When the machine booted (epoch ms); raises OSError or ValueError without a readable /proc."""
    for line in (proc / "stat").read_text().splitlines():
        if line.startswith("btime "):
            return int(line.split()[1]) * 1000
    raise ValueError("no btime")


def started_at_ms(proc: Path, pid: int, boot_ms: int) -> int | None:
    """When the process started (epoch ms, as exact as the boot time); None once it is gone."""
    found = stat(pid, proc)
    if found is None:
        return None
    return boot_ms + found.started * 1000 // os.sysconf("SC_CLK_TCK")


def fd_links(fd_dir: Path) -> list[str] | None:
    """Where the descriptors point; None when they cannot be read (gone, or another user's).

    Read relative to the open directory: building a path per descriptor cost more than reading it.
    """
    try:
        directory = os.open(fd_dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        links = []
        for name in os.listdir(directory):
            with contextlib.suppress(OSError):  # closed meanwhile
                links.append(os.readlink(name, dir_fd=directory))
        return links
    except OSError:
        return None
    finally:
        os.close(directory)


def _gone_or_kernel(proc: Path, pid: int) -> bool:
    """A process that ended meanwhile, or a kernel thread (no files): nothing hidden there."""
    found = stat(pid, proc)
    return found is None or bool(found.flags & PF_KTHREAD)
