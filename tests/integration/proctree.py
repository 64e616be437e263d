"""Kill a process together with every descendant, as a machine crash would.

opencode runs each tool in its own process group, so killing the server's group leaves the tools
running (and, after a restart, the old tool could still finish and write). The tree is read from
/proc, frozen with SIGSTOP so nothing forks or exits-and-reparents while we look, then killed.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterable
from pathlib import Path

from .polling import poll

_PROC = Path("/proc")
_MAX_FREEZE_ROUNDS = 50


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (which may contain spaces or ')')."""
    try:
        raw = (_PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return raw[raw.rindex(")") + 2 :].split()


def _parents() -> dict[int, int]:
    """Map every live pid to its parent pid."""
    parents: dict[int, int] = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is not None:
            parents[int(entry.name)] = int(fields[1])
    return parents


def descendants(root: int) -> set[int]:
    """All processes below `root` in the parent tree (not `root` itself)."""
    children: dict[int, list[int]] = {}
    for pid, ppid in _parents().items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def is_gone(pid: int) -> bool:
    """True once the process has exited; a zombie counts as gone (it runs nothing any more)."""
    fields = _stat_fields(pid)
    return fields is None or fields[0] in ("Z", "X")


def _signal_all(pids: Iterable[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _freeze_tree(root: int) -> set[int]:
    """SIGSTOP `root` and its descendants until a pass finds no new process; return them all."""
    frozen: set[int] = set()
    for _ in range(_MAX_FREEZE_ROUNDS):
        tree = {root} | descendants(root)
        new = tree - frozen
        if not new:
            return frozen
        _signal_all(new, signal.SIGSTOP)
        frozen |= new
    raise RuntimeError(f"process tree of {root} kept growing while being frozen")


def kill_tree(root: int, *, timeout: float = 10.0) -> None:
    """SIGKILL `root` and all its descendants, and wait until none of them runs any more."""
    victims = _freeze_tree(root)
    _signal_all(victims, signal.SIGKILL)
    poll(
        lambda: True if all(is_gone(pid) for pid in victims) else None,
        what=f"processes {sorted(victims)} to die after SIGKILL",
        timeout=timeout,
        interval=0.05,
    )
