"""Benchmark settle-proxy side by side with direct access and nginx, in one run.

Run from the repository root: `python -m bench [--quick] [--only REGEX] [--duration S]`.
Every scenario goes through every target back to back, so slow drift of the machine hits
all columns alike; the ratios in the report compare columns of the same run only.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from types import FrameType

from bench import procs, report, shapes, wrk
from bench.measure import MEASUREMENT_ERRORS, kind, measure_one, memory_row
from bench.report import Results, Row
from bench.scenarios import DownloadScenario, HttpScenario, Scenario, all_scenarios, select, tool_counts
from bench.settings import Layout, Settings, choose_layout
from bench.targets import DEFAULT_PROXY_CMD, TARGETS, Endpoint, TargetContext, TargetUnavailable

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = Path(__file__).with_name("results")
BUSY_LOAD = 0.5


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--duration", type=int, default=5, help="seconds per scenario and target (default 5)")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured wrk seconds before each HTTP run")
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 s per scenario, no warm-up")
    parser.add_argument("--only", metavar="REGEX", help="run only scenarios whose name matches REGEX")
    parser.add_argument(
        "--targets", default=",".join(TARGETS), help=f"comma-separated subset of {list(TARGETS)}"
    )
    parser.add_argument(
        "--pinning", choices=("split", "none"), default="split", help="CPU layout (see README)"
    )
    parser.add_argument("--proxy-cmd", default=DEFAULT_PROXY_CMD, help="proxy command line template")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="where latest.{md,json,png} go")
    parser.add_argument("--list", action="store_true", help="print the scenario names and exit")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        print("\n".join(s.name for s in all_scenarios()))
        return 0
    scenarios = select(all_scenarios(), args.only)
    problem = usage_problem(args, scenarios)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    notes: list[str] = []
    load = os.getloadavg()[0]
    if load > BUSY_LOAD:
        notes.append(f"load average {load:.2f} at start: other work was running, expect noise")
    layout = choose_layout(args.pinning, notes)
    quick = args.quick
    settings = Settings(1 if quick else args.duration, 0 if quick else args.warmup, 1 if quick else 3, layout)
    meta = metadata(args, settings)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        results = run(args, scenarios, settings, notes)
    except KeyboardInterrupt:
        print("interrupted: every process started was stopped", file=sys.stderr)
        return 130
    except procs.StartupError as error:
        print(f"cannot start: {error}", file=sys.stderr)
        return 1
    publish(args.out, results, meta, notes, args.targets.split(","))
    return 0


def usage_problem(args: argparse.Namespace, scenarios: list[Scenario]) -> str | None:
    """Why the run cannot start, checked before any process is started."""
    unknown = sorted(set(args.targets.split(",")) - set(TARGETS))
    if not scenarios:
        return f"no scenario matches {args.only!r} (see --list)"
    if unknown:
        return f"unknown targets {unknown}; known: {list(TARGETS)}"
    if not wrk.available():
        return "wrk not found (Debian: apt-get install -y wrk)"
    if args.duration < 1 or args.warmup < 0:
        return "--duration must be at least 1 and --warmup at least 0 (whole seconds, as wrk takes them)"
    return None


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    """Turn SIGTERM into SystemExit so the ExitStack stops every child on the way out."""
    raise SystemExit(128 + signum)


def run(args: argparse.Namespace, scenarios: list[Scenario], settings: Settings, notes: list[str]) -> Results:
    if settings.layout.load is not None:
        os.sched_setaffinity(0, settings.layout.load)
    with tempfile.TemporaryDirectory(prefix="settle-bench-") as tmp, ExitStack() as stack:
        workdir = Path(tmp)
        upstream = start_upstream(stack, workdir, settings.layout, tool_counts(scenarios))
        ctx = TargetContext(upstream, REPO, workdir, settings.layout.hop, args.proxy_cmd)
        endpoints = start_targets(stack, ctx, args.targets.split(","), notes)
        eta = _eta(scenarios, endpoints, settings)
        _log(f"running {len(scenarios)} scenarios x {len(endpoints)} targets, about {eta} s")
        rows = [row for s in scenarios for row in measure(s, endpoints, upstream, settings)]
        rows += [memory_row(e.name, e.memory) for e in endpoints if e.memory]
    return Results(rows)


def start_upstream(stack: ExitStack, workdir: Path, layout: Layout, counts: list[int]) -> str:
    port = procs.free_port()
    argv = [
        sys.executable,
        "-m",
        "bench.fake_upstream",
        "--port",
        str(port),
        "--tools",
        ",".join(map(str, counts)),
    ]
    service = procs.start(
        stack, "fake upstream", procs.pinned(argv, layout.load), workdir / "upstream.log", REPO
    )
    url = f"http://127.0.0.1:{port}"
    service.wait_http(url + shapes.CONFIG_PATH, timeout_s=120)
    return url


def start_targets(stack: ExitStack, ctx: TargetContext, names: list[str], notes: list[str]) -> list[Endpoint]:
    """Start each target; one that cannot run is reported and left out, not fatal."""
    endpoints = []
    for name in names:
        try:
            endpoints.append(TARGETS[name](ctx, stack))
        except TargetUnavailable as error:
            notes.append(f"target {name} skipped: {str(error).splitlines()[0]}")
            _log(f"target {name} skipped: {error}")
    return endpoints


def _eta(scenarios: list[Scenario], endpoints: list[Endpoint], settings: Settings) -> int:
    per_target = sum(
        settings.duration + (settings.warmup if isinstance(s, HttpScenario) else 0)
        for s in scenarios
        if not isinstance(s, DownloadScenario)
    )
    return per_target * len(endpoints)


def measure(scenario: Scenario, endpoints: list[Endpoint], upstream: str, settings: Settings) -> list[Row]:
    rows = []
    for endpoint in endpoints:
        try:
            row = measure_one(scenario, endpoint, upstream, settings)
        except MEASUREMENT_ERRORS as error:
            row = Row(
                scenario.name, kind(scenario), endpoint.name, {}, f"failed: {type(error).__name__}: {error}"
            )
        _log(f"{scenario.name:<24} {endpoint.name:<7} {_summary(row)}")
        rows.append(row)
    return rows


def _summary(row: Row) -> str:
    shown = ("req/s", "p50 ms", "p99 ms", "MB/s", "RSS peak +MiB")
    return "  ".join(f"{k} {report.fmt(row.metrics[k])}" for k in shown if k in row.metrics) + f"  {row.note}"


def metadata(args: argparse.Namespace, settings: Settings) -> dict[str, str]:
    return {
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": f"{_cpu_model()}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}",
        "load average at start": " ".join(f"{x:.2f}" for x in os.getloadavg()) + " (should be near 0)",
        "pinning": settings.layout.describe(),
        "per scenario": f"{settings.duration} s measured after {settings.warmup} s warm-up, per target",
        "proxy command": args.proxy_cmd,
        "tools": f"{_version(['wrk', '-v'])}; {_version(['nginx', '-v'])}",
        "command": shlex.join(["python", "-m", "bench", *sys.argv[1:]]),
    }


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def _version(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=10)
    except OSError:
        return f"{argv[0]} not installed"
    return (done.stdout + done.stderr).strip().splitlines()[0]


def publish(out: Path, results: Results, meta: dict[str, str], notes: list[str], targets: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    text = report.render(results, meta, notes)
    print(text)
    (out / "latest.md").write_text(text)
    report.write_json(out / "latest.json", results, meta, notes)
    present = [t for t in targets if any(r.target == t for r in results.rows)]
    skipped = report.plot(out / "latest.png", results, present)
    _log(skipped or f"wrote {out / 'latest.md'}, latest.json and latest.png")


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
