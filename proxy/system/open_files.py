"""Who holds what open, from every process's `/proc/PID/fd`, and who listens on a port, from
`/proc/net/tcp{,6}`: what a survey of the processes around a database reads, in one pass.

Every reader takes the `/proc` root (a test's fake tree, else /proc). A process whose fd table
cannot be read (another user's) is counted, never guessed at; one that ended meanwhile, or a
kernel thread (it holds no files), hides nothing and is not.

A file is told by its device and inode (a `stat` of `/proc/PID/fd/N` reaches the file itself),
never by the path `readlink` gives: another process may reach the same file through a hard
link, a bind mount, or a path only its own mount namespace has. The path is kept for the report.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from proxy.system.procfs import stat

PF_KTHREAD = 0x00200000
_LISTEN = "0A"


@dataclass(frozen=True, slots=True)
class FileId:
    """A file as the kernel knows it, by whatever path it is reached."""

    device: int
    inode: int

    @classmethod
    def of(cls, path: str | Path, *, dir_fd: int | None = None) -> FileId | None:
        """The file at `path` (through symlinks); None when it cannot be reached."""
        try:
            found = os.stat(path, dir_fd=dir_fd)
        except OSError:
            return None
        return cls(found.st_dev, found.st_ino)


File = FileId | str
"""A file by its identity, or by its path when it cannot be reached (gone meanwhile, or a fake /proc
whose links name no real file)."""


class Descriptor(NamedTuple):
    """One open descriptor: where `readlink` says it points, and the file it is, if asked for."""

    link: str
    file: FileId | None

    @property
    def identity(self) -> File:
        return self.link if self.file is None else self.file


@dataclass(slots=True)
class OpenFiles:
    """What one process's fd table says, reduced to what a survey needs."""

    sockets: set[str] = field(default_factory=set)
    """Inodes of its sockets."""
    databases: dict[File, str] = field(default_factory=dict)
    """The `*.db` files it holds open, each with the path it reached it by."""
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
        descriptors = fd_links(entry / "fd", identify=_is_database)
        if descriptors is None:
            not_inspected += not _gone_or_kernel(proc, int(entry.name))
            continue
        process = seen[int(entry.name)] = OpenFiles()
        for link, file in descriptors:
            if link.startswith("socket:["):
                process.sockets.add(link[8:-1])
            elif _is_database(link):
                process.databases[link if file is None else file] = link
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


def _is_database(link: str) -> bool:
    return link.endswith(".db")


def _never(_: str) -> bool:
    return False


def fd_links(fd_dir: Path, *, identify: Callable[[str], bool] = _never) -> list[Descriptor] | None:
    """Where the descriptors point, and for those whose link `identify` picks, the file they are;
    None when they cannot be read (gone, or another user's).

    Read relative to the open directory: building a path per descriptor cost more than reading it.
    Only picked descriptors are `stat`ed: a survey reads every process's table.
    """
    try:
        directory = os.open(fd_dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        found = []
        for name in os.listdir(directory):
            with contextlib.suppress(OSError):  # closed meanwhile
                link = os.readlink(name, dir_fd=directory)
                found.append(Descriptor(link, FileId.of(name, dir_fd=directory) if identify(link) else None))
        return found
    except OSError:
        return None
    finally:
        os.close(directory)


def _gone_or_kernel(proc: Path, pid: int) -> bool:
    """A process that ended meanwhile, or a kernel thread (no files): nothing hidden there."""
    found = stat(pid, proc)
    return found is None or bool(found.flags & PF_KTHREAD)
