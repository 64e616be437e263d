"""Benchmark settle-proxy side by side with direct access and nginx, in one run.

Run from the repository root: `python -m bench [--quick] [--only REGEX] [--duration S]`.
Every scenario goes through every target back to back, so slow drift of the machine hits
all columns alike; the ratios in the report compare columns of the same run only.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import aiohttp

from bench import procs, report, shapes, stream, wrk
from bench.procs import Cpus, PeakRss
from bench.report import Results, Row
from bench.scenarios import (
    DownloadScenario,
    HttpScenario,
    Scenario,
    SseScenario,
    all_scenarios,
    select,
    tool_counts,
)
from bench.shapes import Variant
from bench.targets import DEFAULT_PROXY_CMD, TARGETS, Endpoint, TargetContext, TargetUnavailable

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = Path(__file__).with_name("results")
KIB_PER_MIB = 1024
BUSY_LOAD = 0.5
MEASUREMENT_ERRORS = (wrk.WrkError, OSError, aiohttp.ClientError, ValueError, subprocess.SubprocessError)


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
            row = _measure_one(scenario, endpoint, upstream, settings)
        except MEASUREMENT_ERRORS as error:
            row = Row(
                scenario.name, _kind(scenario), endpoint.name, {}, f"failed: {type(error).__name__}: {error}"
            )
        _log(f"{scenario.name:<24} {endpoint.name:<7} {_summary(row)}")
        rows.append(row)
    return rows


def _measure_one(scenario: Scenario, endpoint: Endpoint, upstream: str, settings: Settings) -> Row:
    if isinstance(scenario, HttpScenario):
        return measure_http(scenario, endpoint, upstream, settings)
    if isinstance(scenario, SseScenario):
        return measure_sse(scenario, endpoint, settings)
    return measure_download(scenario, endpoint, settings)


def _kind(scenario: Scenario) -> str:
    return {HttpScenario: "http", SseScenario: "sse", DownloadScenario: "download"}[type(scenario)]


def _summary(row: Row) -> str:
    shown = ("req/s", "p50 ms", "p99 ms", "MB/s", "RSS peak +MiB")
    return "  ".join(f"{k} {report.fmt(row.metrics[k])}" for k in shown if k in row.metrics) + f"  {row.note}"


def measure_http(scenario: HttpScenario, endpoint: Endpoint, upstream: str, settings: Settings) -> Row:
    url = endpoint.base_url + scenario.path
    body = fetch(url)
    note = body_check(scenario, endpoint, body, fetch(upstream + scenario.path))
    if settings.warmup:
        wrk.run(url, scenario.connections, settings.warmup, settings.layout.load)
    before = upstream_requests(endpoint)
    result = wrk.run(url, scenario.connections, settings.duration, settings.layout.load)
    after = upstream_requests(endpoint)
    metrics = {
        "conns": float(scenario.connections),
        "body KB": len(body) / 1000,
        "req/s": result.rps,
        "p50 ms": result.p50_ms,
        "p90 ms": result.p90_ms,
        "p99 ms": result.p99_ms,
        "max ms": result.max_ms,
        "errors": float(result.errors),
    }
    if before is not None and after is not None and after[0] > before[0]:
        metrics["upstream req/req"] = 1 + (after[1] - before[1]) / (after[0] - before[0])
    return Row(scenario.name, "http", endpoint.name, metrics, note, result.raw)


def upstream_requests(endpoint: Endpoint) -> tuple[float, float] | None:
    """(client requests, liveness look-ups) the proxy counted so far, from its own metrics.

    Every client request costs one upstream request plus any liveness look-up, so the ratio
    of the two differences over a run is the upstream requests per client request.
    """
    if not endpoint.rewrites:
        return None
    text = fetch(endpoint.base_url + "/_settle/metrics").decode()
    return _sample_sum(text, "settle_proxy_requests_total"), _sample_sum(
        text, "settle_proxy_liveness_requests_total"
    )


def _sample_sum(exposition: str, name: str) -> float:
    return sum(float(line.split()[-1]) for line in exposition.splitlines() if line.startswith(name + "{"))


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as response:
        body: bytes = response.read()
        return body


def body_check(scenario: HttpScenario, endpoint: Endpoint, body: bytes, reference: bytes) -> str:
    """Confirm the scenario exercises what it claims: only a rewriting target changes only stale lists."""
    changed = json.loads(body) != json.loads(reference)
    expected = endpoint.rewrites and scenario.case is not None and scenario.case.variant is Variant.STALE
    word = "rewritten" if changed else "unchanged"
    return word if changed == expected else f"{word} (UNEXPECTED)"


def measure_sse(scenario: SseScenario, endpoint: Endpoint, settings: Settings) -> Row:
    result = stream.measure_sse(endpoint.base_url, scenario.rate, settings.duration)
    values = result.latencies_ms
    metrics = {
        "events": float(result.expected),
        "lost": float(result.lost),
        "p50 ms": stream.percentile(values, 50),
        "p99 ms": stream.percentile(values, 99),
        "max ms": values[-1] if values else float("nan"),
    }
    return Row(scenario.name, "sse", endpoint.name, metrics, "", {"latencies_ms": values})


def measure_download(scenario: DownloadScenario, endpoint: Endpoint, settings: Settings) -> Row:
    """Median throughput of a few downloads; peak RSS is over all of them together."""
    memory = endpoint.memory
    before = memory.begin_phase() if memory else 0
    runs = [
        stream.measure_download(endpoint.base_url, scenario.size) for _ in range(settings.download_repeats)
    ]
    metrics = {"MB/s": statistics.median(r.mb_per_s for r in runs)}
    if memory:
        peak = memory.phase_peak_kib()
        metrics |= {"RSS before MiB": before / KIB_PER_MIB, "RSS peak +MiB": (peak - before) / KIB_PER_MIB}
    short = sum(r.size != scenario.size for r in runs)
    note = f"{short} of {len(runs)} bodies short" if short else f"median of {len(runs)}"
    return Row(
        scenario.name, "download", endpoint.name, metrics, note, {"seconds": [r.seconds for r in runs]}
    )


def memory_row(target: str, memory: PeakRss) -> Row:
    """The intermediary's resident memory from start to end of the run, and its peak."""
    metrics = {
        "RSS start MiB": memory.start_kib / KIB_PER_MIB,
        "RSS end MiB": memory.rss_kib() / KIB_PER_MIB,
        "RSS peak MiB": memory.run_peak_kib() / KIB_PER_MIB,
    }
    metrics["peak growth MiB"] = metrics["RSS peak MiB"] - metrics["RSS start MiB"]
    return Row("whole run", "memory", target, metrics)


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
