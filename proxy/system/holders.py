"""Which processes hold a file open: how `settle` tells that a server still runs on a database.

A running opencode keeps `opencode.db` (and its `-wal`/`-shm` companions) open for as long as
it runs, so an open descriptor is direct evidence, unlike a guess from ports or pid files.
Linux only (`/proc`); elsewhere nothing can be seen and the caller must be told so. Files are
told by device and inode, so a process that reached the database by another path (a hard link,
a bind mount, another mount namespace) holds it all the same.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from proxy.system.open_files import File, FileId, fd_links
from proxy.system.procfs import PROC, command_line

_COMPANIONS = ("", "-wal", "-shm", "-journal")


@dataclass(frozen=True, slots=True)
class Holder:
    """A process with the file open."""

    pid: int
    command: str


def can_see_holders() -> bool:
    """Whether this system exposes open files the way `holders` reads them."""
    return (PROC / "self" / "fd").is_dir()


def holders(database: Path) -> list[Holder]:
    """Other processes that have `database` or one of its companion files open."""
    targets = _files(database)
    found = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        descriptors = fd_links(entry / "fd", identify=_is_file) or ()
        if any(descriptor.identity in targets for descriptor in descriptors):
            found.append(Holder(int(entry.name), command_line(int(entry.name))))
    return found


def _files(database: Path) -> set[File]:
    """The database and its companions, each by identity where it exists, and by path."""
    paths = [str(database.resolve()) + suffix for suffix in _COMPANIONS]
    return {*paths, *(file for path in paths if (file := FileId.of(path)) is not None)}


def _is_file(link: str) -> bool:
    """A descriptor that may be a file on disk (not a socket, pipe or anonymous inode)."""
    return link.startswith("/")
