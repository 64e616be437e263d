"""Turn measurements into the Markdown tables, the raw JSON and the latency plot."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

COLUMNS: dict[str, list[str]] = {
    "http": [
        "conns",
        "body KB",
        "req/s",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "max ms",
        "errors",
        "upstream req/req",
    ],
    "sse": ["events", "lost", "p50 ms", "p99 ms", "max ms", "+p50 ms", "+p99 ms"],
    "download": ["MB/s", "RSS before MiB", "RSS peak +MiB"],
    "memory": ["RSS start MiB", "RSS end MiB", "RSS peak MiB", "peak growth MiB"],
}
TITLES = {
    "http": "HTTP: closed-loop GETs with wrk",
    "sse": "SSE: per-event delivery latency (upstream write → client read); +ms = added over direct",
    "download": "Streamed download: throughput, and the intermediary's RSS before and peak growth during it",
    "memory": "Intermediary memory over the whole run (RSS summed over its process tree)",
}
# Latency ratios above 1 and throughput ratios below 1 mean the numerator target is slower.
RATIO_METRICS = ("req/s", "p50 ms", "p99 ms", "MB/s")
# proxy/relay is the addons' own cost; relay/direct what the stack (aiohttp, the transport) costs.
RATIOS = (
    ("proxy", "relay"),
    ("relay", "direct"),
    ("proxy", "direct"),
    ("proxy", "nginx"),
    ("nginx", "direct"),
    ("proxy", "mitmproxy"),
)
ADDED = {"+p50 ms": "p50 ms", "+p99 ms": "p99 ms"}
BASELINE = "direct"


@dataclass(frozen=True, slots=True)
class Row:
    """One scenario through one target."""

    scenario: str
    kind: str
    target: str
    metrics: dict[str, float]
    note: str = ""
    raw: dict[str, Any] = field(default_factory=dict)


class Results:
    """All rows of a run, looked up by (scenario, target)."""

    def __init__(self, rows: Iterable[Row]) -> None:
        self.rows = list(rows)
        self._index = {(r.scenario, r.target): r for r in self.rows}

    def metric(self, scenario: str, target: str, name: str) -> float | None:
        row = self._index.get((scenario, target))
        return None if row is None else row.metrics.get(name)

    def scenarios(self, kind: str) -> list[str]:
        return list(dict.fromkeys(r.scenario for r in self.rows if r.kind == kind))

    def cell(self, row: Row, column: str) -> float | None:
        """A measured metric, or for `+…` columns the difference to the direct baseline."""
        if column not in ADDED:
            return row.metrics.get(column)
        base = self.metric(row.scenario, BASELINE, ADDED[column])
        own = row.metrics.get(ADDED[column])
        return None if base is None or own is None or row.target == BASELINE else own - base


def fmt(value: float | None) -> str:
    """Three or so significant digits, thousands separated: tables are read, not parsed."""
    if value is None or math.isnan(value):
        return "-"
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}" if magnitude >= 1 or value == 0 else f"{value:.3f}"


def markdown_table(header: Sequence[str], lines: Iterable[Sequence[str]]) -> str:
    rows = [header, ["---"] * len(header), *lines]
    return "\n".join("| " + " | ".join(row) + " |" for row in rows)


def kind_table(results: Results, kind: str) -> str:
    columns = COLUMNS[kind]
    lines = [
        [row.scenario, row.target, *(fmt(results.cell(row, c)) for c in columns), row.note]
        for row in results.rows
        if row.kind == kind
    ]
    return markdown_table(["scenario", "target", *columns, "note"], lines)


def ratio_table(results: Results, pairs: Sequence[tuple[str, str]]) -> str:
    lines = []
    for kind, columns in COLUMNS.items():
        for scenario in results.scenarios(kind):
            for metric in (m for m in RATIO_METRICS if m in columns):
                lines.append([scenario, metric, *(_ratio(results, scenario, metric, p) for p in pairs)])
    return markdown_table(["scenario", "metric", *(f"{a}/{b}" for a, b in pairs)], lines)


def _ratio(results: Results, scenario: str, metric: str, pair: tuple[str, str]) -> str:
    top, bottom = (results.metric(scenario, target, metric) for target in pair)
    return fmt(top / bottom) if top is not None and bottom else "-"


def render(results: Results, meta: dict[str, str], notes: Sequence[str]) -> str:
    parts = ["# settle-proxy benchmark", "", *(f"- **{k}**: {v}" for k, v in meta.items())]
    for kind in COLUMNS:
        if results.scenarios(kind):
            parts += ["", f"## {TITLES[kind]}", "", kind_table(results, kind)]
    present = {r.target for r in results.rows}
    pairs = [pair for pair in RATIOS if set(pair) <= present]
    if pairs:
        parts += ["", "## Ratios (req/s, MB/s: below 1 = slower; latency: above 1 = slower)", ""]
        parts.append(ratio_table(results, pairs))
    if notes:
        parts += ["", "## Notes", "", *(f"- {note}" for note in notes)]
    return "\n".join(parts) + "\n"


def write_json(path: Path, results: Results, meta: dict[str, str], notes: Sequence[str]) -> None:
    payload = {"meta": meta, "notes": list(notes), "rows": [asdict(r) for r in results.rows]}
    path.write_text(json.dumps(payload, indent=2) + "\n")


def plot(path: Path, results: Results, targets: Sequence[str]) -> str | None:
    """p50 (solid) and p99 (pale) latency per scenario and target; log scale, since lists of
    10,000 parts are orders of magnitude slower than small JSON. Returns why it was skipped."""
    scenarios = results.scenarios("http") + results.scenarios("sse")
    if not scenarios:
        return "no latency scenario was run: no plot"
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib): no plot"
    height = 0.8 / max(len(targets), 1)
    figure, axes = plt.subplots(figsize=(10, 0.45 * len(scenarios) * max(len(targets), 1) / 2 + 1.5))
    for index, target in enumerate(targets):
        ys = [y + index * height for y in range(len(scenarios))]
        p50 = [results.metric(s, target, "p50 ms") or math.nan for s in scenarios]
        p99 = [results.metric(s, target, "p99 ms") or math.nan for s in scenarios]
        color = f"C{index}"
        axes.barh(ys, p99, height=height, color=color, alpha=0.35)
        axes.barh(ys, p50, height=height, color=color, label=f"{target} (p50 solid, p99 pale)")
    axes.set_yticks([y + height * (len(targets) - 1) / 2 for y in range(len(scenarios))], scenarios)
    axes.invert_yaxis()
    axes.set_xscale("log")
    axes.set_xlabel("latency, ms (log scale)")
    axes.set_title("settle-proxy benchmark: latency per scenario and target")
    axes.legend(loc="lower right", fontsize="small")
    axes.grid(axis="x", which="both", alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=130)
    plt.close(figure)
    return None
