"""What the benchmark measures: the registry of scenarios, each run through every target."""

from __future__ import annotations

import re
from dataclasses import dataclass

from bench import shapes
from bench.shapes import Api, MessageCase

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class HttpScenario:
    """Closed-loop GETs of one path with wrk; `case` is set for message lists."""

    name: str
    path: str
    connections: int
    case: MessageCase | None = None


@dataclass(frozen=True, slots=True)
class SseScenario:
    """One SSE stream at a fixed event rate; measures per-event delivery latency."""

    name: str
    rate: int


@dataclass(frozen=True, slots=True)
class DownloadScenario:
    """A large streamed body; measures throughput and the intermediary's peak RSS growth."""

    name: str
    size: int


Scenario = HttpScenario | SseScenario | DownloadScenario


def all_scenarios() -> list[Scenario]:
    """Small JSON shows the fixed cost of a hop; message lists show the cost of inspecting bodies.

    Message lists run at one connection, like the one UI that reads a session at a time.
    """
    scenarios: list[Scenario] = [
        HttpScenario("json-2k-c1", shapes.CONFIG_PATH, 1),
        HttpScenario("json-2k-c16", shapes.CONFIG_PATH, 16),
    ]
    cases = shapes.message_cases([1000, 10000], [Api.V2]) + shapes.message_cases([1000], [Api.V1])
    scenarios += [HttpScenario(case.name, case.path, 1, case) for case in cases]
    scenarios += [SseScenario(f"sse-{rate}-per-s", rate) for rate in (100, 1000)]
    scenarios.append(DownloadScenario("download-100MiB", 100 * MIB))
    return scenarios


def select(scenarios: list[Scenario], pattern: str | None) -> list[Scenario]:
    """Scenarios whose name matches the regular expression `pattern` anywhere (all if None)."""
    if pattern is None:
        return scenarios
    regex = re.compile(pattern)
    return [s for s in scenarios if regex.search(s.name)]


def tool_counts(scenarios: list[Scenario]) -> list[int]:
    """The message sizes the fake upstream must precompute for these scenarios."""
    return sorted({s.case.tools for s in scenarios if isinstance(s, HttpScenario) and s.case is not None})
