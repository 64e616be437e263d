"""`python -m proxy settle` run the way a user runs it: from the repository, with no opencode
server credentials in the environment (the harness may have some; a user's shell has none)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .opencode_server import REPO_ROOT

SETTLE_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class SettleRun:
    """One finished `settle` run: exit code, output, and when (epoch s) it started and ended."""

    code: int
    out: str
    err: str
    started: float
    ended: float


def environment() -> dict[str, str]:
    """The test's environment without server credentials, as a user would run `settle`."""
    return {name: value for name, value in os.environ.items() if not name.startswith("OPENCODE_SERVER")}


def settle_command(database: Path, *args: str) -> list[str]:
    """`python -m proxy settle --db DATABASE ARGS` (such as `--upstream URL`)."""
    return [sys.executable, "-m", "proxy", "settle", "--db", str(database), *args]


def run_settle(database: Path, *args: str, timeout: float = SETTLE_TIMEOUT_S) -> SettleRun:
    """Run `settle` to its end (bounded by `timeout`) and return what it said."""
    started = time.time()
    done = subprocess.run(
        settle_command(database, *args),
        cwd=REPO_ROOT,
        env=environment(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return SettleRun(done.returncode, done.stdout, done.stderr, started, time.time())
