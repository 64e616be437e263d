"""The report of `python -m bench.real_server`: per scenario and target the median and range of
each figure over the rounds, and each hop's ratio to direct per round (measured moments apart).
nginx, a plain reverse proxy that inspects nothing, is the reference for what any hop costs
against the real server.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.report import fmt, markdown_table

TARGETS = ("direct", "proxy", "nginx")
HOPS = ("proxy", "nginx")


@dataclass(frozen=True, slots=True)
class Sample:
    """One wrk run: a scenario through one target in one round."""

    scenario: str
    round: int
    target: str
    body_kb: float
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int
    upstream_per_request: float | None = None
    """Through the proxy: upstream requests per client request (liveness look-ups included)."""


def render(samples: list[Sample], meta: dict[str, str], notes: Sequence[str]) -> str:
    parts = ["# settle-proxy against the real opencode", "", *(f"- **{k}**: {v}" for k, v in meta.items())]
    parts += ["", "## Message lists, direct and through the proxy (median, min-max over rounds)", ""]
    parts.append(figures_table(samples))
    parts += ["", "## Each hop's req/s over direct's, per round (below 1: slower than direct)", ""]
    parts.append(ratio_table(samples))
    if notes:
        parts += ["", "## Notes", "", *(f"- {note}" for note in notes)]
    return "\n".join(parts) + "\n"


def figures_table(samples: list[Sample]) -> str:
    lines = []
    for scenario in _scenarios(samples):
        for target in TARGETS:
            mine = [s for s in samples if s.scenario == scenario and s.target == target]
            if not mine:
                continue  # nginx is not installed
            upstream = [s.upstream_per_request for s in mine if s.upstream_per_request is not None]
            lines.append(
                [
                    scenario,
                    target,
                    fmt(mine[0].body_kb),
                    *(_spread([getattr(s, name) for s in mine]) for name in ("rps", "p50_ms", "p99_ms")),
                    str(sum(s.errors for s in mine)),
                    fmt(max(upstream)) if upstream else "-",
                ]
            )
    header = [
        "scenario",
        "target",
        "body KB",
        "req/s",
        "p50 ms",
        "p99 ms",
        "errors",
        "upstream req/req (max)",
    ]
    return markdown_table(header, lines)


def ratio_table(samples: list[Sample]) -> str:
    lines = []
    for scenario in _scenarios(samples):
        for hop in HOPS:
            ratios = ratios_per_round(samples, scenario, hop)
            if ratios:
                lines.append(
                    [
                        scenario,
                        f"{hop}/direct",
                        fmt(statistics.median(ratios)),
                        _range(ratios),
                        ", ".join(map(fmt, ratios)),
                    ]
                )
    return markdown_table(["scenario", "ratio", "median", "min-max", "rounds"], lines)


def ratios_per_round(samples: list[Sample], scenario: str, hop: str = "proxy") -> list[float]:
    """`hop`/direct throughput of each round, from the measurements taken in that round."""
    rps = {(s.round, s.target): s.rps for s in samples if s.scenario == scenario}
    rounds = sorted({number for number, _ in rps})
    return [rps[n, hop] / rps[n, "direct"] for n in rounds if rps.get((n, "direct")) and (n, hop) in rps]


def _scenarios(samples: list[Sample]) -> list[str]:
    return list(dict.fromkeys(s.scenario for s in samples))


def _spread(values: list[float]) -> str:
    return f"{fmt(statistics.median(values))} ({_range(values)})"


def _range(values: list[float]) -> str:
    return f"{fmt(min(values))}-{fmt(max(values))}"


def publish(out: Path, samples: list[Sample], meta: dict[str, str], notes: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    text = render(samples, meta, notes)
    print(text)
    (out / "real-latest.md").write_text(text)
    payload = {"meta": meta, "notes": notes, "samples": [asdict(s) for s in samples]}
    (out / "real-latest.json").write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {out / 'real-latest.md'} and real-latest.json", file=sys.stderr, flush=True)
