"""Latency in pairs: what a hop adds, read from requests taken one after the other on each path.

The real server's own speed drifts far more than a hop costs (opencode went from 52 to 94 req/s
between two wrk windows here), so throughput windows taken seconds apart cannot show a
millisecond. Requests taken in turn, one per path in a round with the order rotated, meet the
same server state: the difference of each round's hop and direct is what the hop added, and
its median and p90 say how much, whatever the server did meanwhile. Pure: no I/O here.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bench.stream import percentile

BASELINE = "direct"


def rotated(targets: Sequence[str], number: int) -> list[str]:
    """The order of round `number`: `targets` rotated by it, so each path goes first, second and
    last equally often and none always meets a server just woken or just warmed by another."""
    shift = number % len(targets)
    return [*targets[shift:], *targets[:shift]]


def differences(times_ms: Mapping[str, Sequence[float]], hop: str) -> list[float]:
    """`hop`'s time minus direct's, round by round."""
    return [own - base for own, base in zip(times_ms[hop], times_ms[BASELINE], strict=True)]


@dataclass(frozen=True, slots=True)
class PathFigures:
    """One path's figures over one list: its own latency, what it adds over direct, its CPU."""

    target: str
    p50_ms: float
    p99_ms: float
    added_median_ms: float | None
    """The median of the paired differences against direct (None for direct itself)."""
    added_p90_ms: float | None
    cpu_ms_per_request: float | None
    """CPU time of the hop's processes over the measurement, per request it served."""


def figures(
    times_ms: Mapping[str, Sequence[float]], cpu_ms_per_request: Mapping[str, float]
) -> list[PathFigures]:
    """Each path's figures, in the order of `times_ms`."""
    found = []
    for target, times in times_ms.items():
        ascending = sorted(times)
        added = sorted(differences(times_ms, target)) if target != BASELINE else []
        found.append(
            PathFigures(
                target,
                percentile(ascending, 50),
                percentile(ascending, 99),
                statistics.median(added) if added else None,
                percentile(added, 90) if added else None,
                cpu_ms_per_request.get(target),
            )
        )
    return found


def cpu_ms_per_request(ticks_before: int, ticks_after: int, ticks_per_s: int, requests: int) -> float:
    """The CPU time a process tree used between two readings of its clock ticks (user + system),
    in milliseconds per request it served meanwhile."""
    if requests < 1:
        raise ValueError("no request was served")
    return (ticks_after - ticks_before) * 1000 / ticks_per_s / requests
