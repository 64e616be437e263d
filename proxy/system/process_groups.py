"""Process groups and who holds a process's output: what tells a tool call whose own process has
exited from one that still runs, and names what keeps it open.

A command a tool starts leads a process group of its own; what it starts in the background
(`sleep 90 &`, `npm run dev &`) stays in that group after the leader exits, and holds the
leader's standard output and error, which the server reads until every holder has closed them.
Outputs are told by the file they are (device and inode of `/proc/PID/fd/1` and `2`: a pipe, a
socket), never by the path `readlink` gives. Every reader takes the `/proc` root (a test's fake
tree, else /proc) and returns nothing for a process that is gone by the time it looks.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from proxy.system.open_files import FileId
from proxy.system.procfs import PROC, Stat, command_line, stat

_OUTPUTS = ("1", "2")


@dataclass(frozen=True, slots=True)
class Member:
    """A live process (not a zombie) of a group, as it is shown: its command line may hold a
    secret, so only its program is ever shown to a client of the proxy."""

    pid: int
    command: str
    started: int
    parent: int


def outputs(pid: int, proc: Path = PROC) -> frozenset[FileId]:
    """The files the process's standard output and error are (none once it is gone)."""
    found = (FileId.of(proc / str(pid) / "fd" / fd) for fd in _OUTPUTS)
    return frozenset(file for file in found if file is not None)


def alive(pid: int, started: int | None, proc: Path = PROC) -> bool:
    """Whether the process still runs (a zombie has exited); `started` tells it from a later
    process given the same pid (None: the pid alone, for a leader never seen alive)."""
    found = stat(pid, proc)
    return found is not None and found.state != "Z" and (started is None or found.started == started)


def processes(proc: Path = PROC) -> dict[int, Stat]:
    """Every process's stat now."""
    found = {}
    for entry in proc.iterdir():
        if entry.name.isdigit() and (read := stat(int(entry.name), proc)) is not None:
            found[int(entry.name)] = read
    return found


def members(group: int, proc: Path = PROC, *, table: dict[int, Stat] | None = None) -> list[Member]:
    """The live processes of `group`, its leader included while it runs."""
    table = processes(proc) if table is None else table
    return [
        Member(pid, command_line(pid, proc), found.started, found.parent)
        for pid, found in sorted(table.items())
        if found.group == group and found.state != "Z"
    ]


def holding(
    files: frozenset[FileId], excluded: set[int], proc: Path = PROC, *, table: dict[int, Stat] | None = None
) -> list[Member]:
    """The live processes, but `excluded`, whose standard output or error is one of `files`."""
    if not files:
        return []
    table = processes(proc) if table is None else table
    return [
        Member(pid, command_line(pid, proc), found.started, found.parent)
        for pid, found in sorted(table.items())
        if pid not in excluded and found.state != "Z" and outputs(pid, proc) & files
    ]


def leaderless(parents: set[int], since: int, proc: Path = PROC) -> dict[int, list[Member]]:
    """Groups whose leader has exited (gone, or a zombie), each with its live members: those of
    them that are children of `parents` (the server, or whoever adopted what it started), none
    started before `since` (clock ticks since boot)."""
    table = processes(proc)
    found: dict[int, list[Member]] = {}
    for pid, process in table.items():
        group = process.group
        if group == pid or process.state == "Z" or process.parent not in parents:
            continue
        leader = table.get(group)
        if leader is not None and leader.state != "Z":
            continue
        found.setdefault(group, [])
    for group in found:
        found[group] = members(group, proc, table=table)
    return {
        group: each
        for group, each in found.items()
        if each and all(member.started >= since for member in each)
    }
