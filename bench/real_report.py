"""The report of `python -m bench.real_server`: first each list's paired latency (each path's p50
and p99, what each hop adds over direct, the hops' CPU per request); then wrk's rounds, per
scenario and target the median and range of each figure over the rounds, and each hop's ratio to
direct per round (measured moments apart). nginx, a plain reverse proxy that inspects nothing, is
the reference for what any hop costs against the real server.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.pairs import PathFigures, figures
from bench.real_pairs import PairedRun
from bench.report import fmt, markdown_table

TARGETS = ("direct", "relay", "proxy", "nginx")
HOPS = ("proxy", "relay", "nginx")


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


def render(
    paired: dict[str, PairedRun], samples: list[Sample], meta: dict[str, str], notes: Sequence[str]
) -> str:
    parts = ["# settle-proxy against the real opencode", "", *(f"- **{k}**: {v}" for k, v in meta.items())]
    if paired:
        parts += ["", "## Latency in pairs: one request per path in turn (added: hop minus direct)", ""]
        parts.append(pairs_table(paired))
    if samples:
        parts += ["", "## wrk: message lists through each path (median, min-max over rounds)", ""]
        parts.append(figures_table(samples))
        parts += ["", "## Each hop's req/s over direct's, per round (below 1: slower than direct)", ""]
        parts.append(ratio_table(samples))
    if notes:
        parts += ["", "## Notes", "", *(f"- {note}" for note in notes)]
    return "\n".join(parts) + "\n"


def pairs_table(paired: dict[str, PairedRun]) -> str:
    """Per list and path: p50, p99, the median and p90 of what it adds over direct, its CPU per
    request; on the proxy's line, how far its added median and p90 are from nginx's and from the
    relay's (the proxy's own stack with no addons)."""
    lines = []
    for scenario, run in paired.items():
        found = {f.target: f for f in figures(run.times_ms, run.cpu_ms_per_request)}
        for target, own in found.items():
            others = ("nginx", "relay") if target == "proxy" else ()
            beyond = [_beyond(own, found.get(other)) for other in others] or ["-", "-"]
            added = (own.added_median_ms, own.added_p90_ms)
            lines.append(
                [
                    scenario,
                    target,
                    str(len(run.times_ms[target])),
                    fmt(own.p50_ms),
                    fmt(own.p99_ms),
                    *("-" if value is None else _signed(value) for value in added),
                    *beyond,
                    fmt(own.cpu_ms_per_request),
                ]
            )
    header = ["list", "path", "requests", "p50 ms", "p99 ms", "added median ms", "added p90 ms"]
    beyond_header = ["proxy - nginx (median / p90)", "proxy - relay (median / p90)"]
    return markdown_table([*header, *beyond_header, "CPU ms/req"], lines)


def _beyond(own: PathFigures, other: PathFigures | None) -> str:
    """How far `own`'s added median and p90 are from `other`'s."""
    if other is None:
        return "-"
    return " / ".join(
        _signed(a - b)
        for a, b in ((own.added_median_ms, other.added_median_ms), (own.added_p90_ms, other.added_p90_ms))
        if a is not None and b is not None
    )


def _signed(value: float) -> str:
    return ("+" if value >= 0 else "") + fmt(value)


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


def publish(
    out: Path, paired: dict[str, PairedRun], samples: list[Sample], meta: dict[str, str], notes: list[str]
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    text = render(paired, samples, meta, notes)
    print(text)
    (out / "real-latest.md").write_text(text)
    payload = {
        "meta": meta,
        "notes": notes,
        "pairs": {scenario: asdict(run) for scenario, run in paired.items()},
        "samples": [asdict(s) for s in samples],
    }
    (out / "real-latest.json").write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {out / 'real-latest.md'} and real-latest.json", file=sys.stderr, flush=True)
