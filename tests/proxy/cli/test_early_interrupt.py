"""Ctrl-C at any moment of a start, as a terminal sends it (to the job's process group): no
traceback, at most one line besides the proxy's own log records of its stop, and no server left.

A moment is counted from when the proxy's own code runs (its first import of the command line,
as `-X importtime` shows it): before that the interpreter itself is starting, and what it prints
on an interrupt is not the proxy's to say.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.integration.polling import poll
from tests.proxy.supervision.test_run import FAKE_SERVER, alive

RUNS_OUR_CODE = re.compile(r"^import time:.*\|\s+proxy\.cli\.options$")
LOG_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (INFO|WARNING) ")
"""A line of the proxy's log (text format) at INFO or WARNING: its stop says itself in these."""


class Started:
    """`python -X importtime -m proxy ARGUMENTS` in a process group of its own, its output read
    line by line as it comes."""

    def __init__(self, arguments: list[str], home: Path) -> None:
        environment = {**os.environ, "XDG_STATE_HOME": str(home / "state"), "XDG_DATA_HOME": str(home)}
        self.process = subprocess.Popen(
            [sys.executable, "-X", "importtime", "-m", "proxy", *arguments],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            process_group=0,
            env=environment,
        )
        self.lines: list[str] = []
        self.runs_our_code = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            self.lines.append(line)
            if RUNS_OUR_CODE.match(line):
                self.runs_our_code.set()

    def interrupt_after(self, delay: float) -> list[str]:
        """Ctrl-C `delay` seconds after the proxy's code began to run; the lines it printed after
        (import timings left out), once it ended."""
        assert self.runs_our_code.wait(60), self.lines
        time.sleep(delay)
        before = len(self.lines)
        os.killpg(self.process.pid, signal.SIGINT)
        self.process.wait(timeout=60)
        self._reader.join(timeout=10)
        return [line for line in self.lines[before:] if not line.startswith("import time:")]


@pytest.mark.parametrize("delay", [0.0, 0.05, 0.3, 0.9])
@pytest.mark.parametrize("supervising", [False, True], ids=["serve", "run"])
def test_ctrl_c_early_in_a_start_is_quiet_and_leaves_no_server(
    tmp_path: Path, delay: float, supervising: bool
) -> None:
    pid_file = tmp_path / "server.pid"
    if supervising:
        arguments = ["run", "--port", "0", "--", sys.executable, FAKE_SERVER, "--pid-file", str(pid_file)]
    else:
        arguments = ["--upstream", "http://127.0.0.1:9", "--port", "0"]
    started = Started(arguments, tmp_path)
    try:
        after = started.interrupt_after(delay)
    finally:
        if started.process.poll() is None:
            os.killpg(started.process.pid, signal.SIGKILL)
            started.process.wait(timeout=10)
    assert not any("Traceback" in line or "KeyboardInterrupt" in line for line in started.lines), (
        started.lines
    )
    assert len([line for line in after if not LOG_RECORD.match(line)]) <= 1, after
    assert started.process.returncode in (0, 130, -signal.SIGINT), started.lines
    if pid_file.exists():
        server = int(pid_file.read_text())
        poll(lambda: not alive(server) or None, what=f"the server (pid {server}) gone", timeout=10)
