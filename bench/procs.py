"""Start, pin, wait for and stop the benchmark's processes, and read their memory from /proc.

Every child gets its own process group, so stopping it also stops whatever it forked (nginx's
worker, a proxy's helpers) and nothing else; every stop is registered on an ExitStack, so it
runs on success, on error and on Ctrl-C alike.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path

Cpus = frozenset[int]
STOP_GRACE_S = 5.0


class StartupError(RuntimeError):
    """A service exited or never answered; the message carries the end of its log."""


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now (the kernel picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def pinned(argv: Sequence[str], cpus: Cpus | None) -> list[str]:
    """Prefix `taskset` so the affinity holds from exec on, for every thread and child."""
    if cpus is None:
        return list(argv)
    return ["taskset", "-c", ",".join(map(str, sorted(cpus))), *argv]


class Service:
    """One child process, with its output in a log file."""

    def __init__(self, name: str, argv: Sequence[str], log: Path, cwd: Path | None = None) -> None:
        self.name = name
        self.log = log
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=cwd,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_tail(self, lines: int = 25) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM to the group, SIGKILL if it lingers; the group id is our child's own pid."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, sig)
            try:
                self.process.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                continue
            return

    def wait_http(self, url: str, timeout_s: float = 30.0) -> None:
        """Block until `url` answers 200, failing early if the process dies."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise StartupError(f"{self.name} exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.1)
        raise StartupError(f"{self.name} did not answer {url} within {timeout_s:.0f}s:\n{self.log_tail()}")


def start(stack: ExitStack, name: str, argv: Sequence[str], log: Path, cwd: Path | None = None) -> Service:
    """Start a service whose stop is guaranteed by `stack`."""
    service = Service(name, argv, log, cwd)
    stack.callback(service.stop)
    return service


def process_tree(pid: int) -> list[int]:
    """`pid` and all its descendants, from /proc/<pid>/task/*/children."""
    pids = [pid]
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            for child in (task / "children").read_text().split():
                pids.extend(process_tree(int(child)))
    return pids


def cpu_ticks(pid: int) -> int:
    """User and system CPU time of `pid`'s process tree so far, in clock ticks (`SC_CLK_TCK` a
    second), from /proc/<pid>/stat; a process's ended threads count, its ended children not."""
    total = 0
    for member in process_tree(pid):
        with contextlib.suppress(OSError):
            text = Path(f"/proc/{member}/stat").read_text()
            fields = text[text.rindex(")") + 2 :].split()  # the name may hold spaces and parentheses
            total += int(fields[11]) + int(fields[12])
    return total


def status_kib(pid: int, field: str) -> int:
    """A `kB` field of /proc/<pid>/status, e.g. VmRSS or VmHWM."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise KeyError(f"{field} not in /proc/{pid}/status")


def _sum_kib(pids: list[int], field: str) -> int:
    return sum(status_kib(pid, field) for pid in pids)


class PeakRss:
    """Resident memory of a process tree: at start, per phase, and its peak over the whole run.

    A phase resets the kernel's peak (VmHWM, via clear_refs 5) so that its own peak shows even
    when an earlier phase went higher; the run-wide peak is therefore kept here across resets.
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.start_kib = self.rss_kib()
        self._peak_kib = _sum_kib(process_tree(pid), "VmHWM")

    def rss_kib(self) -> int:
        return _sum_kib(process_tree(self.pid), "VmRSS")

    def run_peak_kib(self) -> int:
        self._peak_kib = max(self._peak_kib, _sum_kib(process_tree(self.pid), "VmHWM"))
        return self._peak_kib

    def begin_phase(self) -> int:
        """Reset the kernel's peak and return the RSS the phase starts from."""
        self.run_peak_kib()
        for pid in process_tree(self.pid):
            Path(f"/proc/{pid}/clear_refs").write_text("5")
        return self.rss_kib()

    def phase_peak_kib(self) -> int:
        return _sum_kib(process_tree(self.pid), "VmHWM")
