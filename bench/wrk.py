"""Closed-loop HTTP load with wrk: requests/s and latency percentiles of one URL.

wrk (C, event loop) costs far less per request than any Python client, so on a shared core
it leaves the most CPU to the fake upstream. Its `done` hook (wrk_report.lua) prints the
summary as one JSON line, which is what this module reads.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import procs
from bench.procs import Cpus

LUA = Path(__file__).with_name("wrk_report.lua")
MARK = "WRKJSON "
REQUEST_TIMEOUT_S = 10


class WrkError(RuntimeError):
    """wrk is missing, failed, or printed no summary."""


@dataclass(frozen=True, slots=True)
class WrkResult:
    requests: int
    seconds: float
    errors: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    raw: dict[str, Any]

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


def available() -> bool:
    return shutil.which("wrk") is not None


def run(url: str, connections: int, seconds: int, cpus: Cpus | None) -> WrkResult:
    """One wrk thread: with at most one spare core, more threads would only contend."""
    argv = procs.pinned(
        [
            "wrk",
            "-t1",
            f"-c{connections}",
            f"-d{seconds}",
            f"--timeout={REQUEST_TIMEOUT_S}",
            "-s",
            str(LUA),
            url,
        ],
        cpus,
    )
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=seconds + 60)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith(MARK)), None)
    if done.returncode != 0 or line is None:
        raise WrkError(f"wrk failed ({done.returncode}): {done.stdout[-500:]} {done.stderr[-500:]}")
    return parse(json.loads(line.removeprefix(MARK)))


def parse(raw: dict[str, Any]) -> WrkResult:
    latency = raw["latency_us"]
    return WrkResult(
        requests=raw["requests"],
        seconds=raw["duration_us"] / 1e6,
        errors=sum(raw["errors"].values()),
        p50_ms=latency["p50"] / 1e3,
        p90_ms=latency["p90"] / 1e3,
        p99_ms=latency["p99"] / 1e3,
        max_ms=latency["max"] / 1e3,
        raw=raw,
    )
