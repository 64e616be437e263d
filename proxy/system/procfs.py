"""What Linux's /proc says about a process: the few fields the proxy reads, parsed in one place.

Every reader returns None for a process that is gone, or not ours to read, by the time it looks.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
_BOOT_CLOCK = getattr(time, "CLOCK_BOOTTIME", None)


@dataclass(frozen=True, slots=True)
class Stat:
    """The fields of /proc/PID/stat the proxy uses."""

    state: str
    """`R`, `S`, … and `Z` for a zombie (ended, waiting to be reaped)."""
    parent: int
    group: int
    started: int
    """Start time in clock ticks since boot: with the pid, it names one process for good."""
    flags: int
    """The kernel's `PF_*` flags: `PF_KTHREAD` marks a kernel thread."""


def stat(pid: int, proc: Path = PROC) -> Stat | None:
    """The process's stat line, from `proc` (a test's fake tree, else /proc)."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the command name may hold spaces and parentheses
    return Stat(fields[0], int(fields[1]), int(fields[2]), int(fields[19]), int(fields[6]))


def command_line(pid: int, proc: Path = PROC) -> str:
    """The process's command line as one string ("?" when it cannot be read)."""
    try:
        return (
            (proc / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        )
    except OSError:
        return "?"


def program_name(command: str) -> str:
    """Only the program of a command line (`/usr/bin/opencode serve …` → `opencode`): what may be
    shown to anyone who can ask, since the rest of a command line may hold a secret."""
    return os.path.basename(command.split(" ", 1)[0])


def pids() -> Iterator[int]:
    """Every process id in /proc right now."""
    return (int(entry.name) for entry in PROC.iterdir() if entry.name.isdigit())


def ticks_since_boot() -> int:
    """Now, in the unit of /proc's start times (clock ticks since boot); 0 where unknown."""
    if _BOOT_CLOCK is None:
        return 0
    return time.clock_gettime_ns(_BOOT_CLOCK) * os.sysconf("SC_CLK_TCK") // 1_000_000_000
