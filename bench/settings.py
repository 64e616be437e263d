"""How a benchmark run is timed, and which CPUs each of its roles may use."""

from __future__ import annotations

import os
from dataclasses import dataclass

from bench.procs import Cpus


@dataclass(frozen=True, slots=True)
class Layout:
    """Which CPUs each role may use; None leaves it to the scheduler.

    `load` holds the fake upstream, wrk and this process's own clients; `hop` holds the
    intermediary under test. Each role then has the same CPU in every column, and the
    intermediary never steals cycles from the upstream or the load generator.
    """

    load: Cpus | None
    hop: Cpus | None

    def describe(self) -> str:
        if self.load is None or self.hop is None:
            return "none: every process may run on any CPU"
        return (
            f"split: fake upstream + load generator + clients on CPU {_cpus(self.load)}, "
            f"the intermediary under test (proxy, nginx, mitmproxy) on CPU {_cpus(self.hop)}"
        )


@dataclass(frozen=True, slots=True)
class Settings:
    duration: int
    warmup: int
    download_repeats: int
    layout: Layout


def _cpus(cpus: Cpus) -> str:
    return ",".join(map(str, sorted(cpus)))


def choose_layout(name: str, notes: list[str]) -> Layout:
    cpus = sorted(os.sched_getaffinity(0))
    if name == "split" and len(cpus) >= 2:
        return Layout(frozenset(cpus[:1]), frozenset(cpus[1:]))
    if name == "split":
        notes.append("only one CPU available: running unpinned")
    return Layout(None, None)
