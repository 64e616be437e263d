"""settle-proxy against the real `opencode serve`: message lists direct, through the
relay, nginx and the proxy.

Run from the repository root: `python -m bench.real_server [--pairs N] [--rounds N]`. The fake
upstream of `python -m bench` answers in microseconds, which makes the proxy's share look large;
here opencode builds each list itself (tens of milliseconds for a few hundred KB), which is what
a user waits for. First, latency in pairs (`bench/real_pairs.py`): requests one at a time, one per
path in turn, so each hop's added latency is read against a direct request taken moments before
or after. Then wrk's throughput rounds: every scenario through every path back to back
(alternating which goes first).

The server, its turns and the crash come from the integration tests' harness
(`tests/integration`), not a copy of it: it already knows opencode 1.18.33's quirks (the mock
provider's warm-up before a v2 prompt, the v1 directory header, when a running tool is stable),
and the stale sessions measured here are then made exactly as the ones the tests settle.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from bench import procs, wrk
from bench.procs import Cpus
from bench.real_pairs import PairedRun, measure_pairs
from bench.real_report import TARGETS, Sample, publish
from bench.real_sessions import NotMeasurable, Scenario, check, get, seed
from bench.targets import (
    DEFAULT_PROXY_CMD,
    Endpoint,
    TargetContext,
    TargetUnavailable,
    start_nginx,
    start_proxy,
    start_relay,
)
from proxy.demo.model import MockModel
from tests.integration.opencode_server import running_opencode

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = Path(__file__).with_name("results")
CONNECTIONS = 1
LIST_BYTES = 444_000
"""The v1 list size the project's goal is stated for (opencode needs ~33 ms to build it)."""
PAIRS = 400
PAIR_WARMUP = 20
"""Unmeasured rounds before the paired ones: connections opened, every path's code warm."""
BUSY_LOAD = 0.5
KIB_PER_MIB = 1024


@dataclass(frozen=True, slots=True)
class Settings:
    duration: int
    warmup: int
    rounds: int
    pairs: int
    load: Cpus | None
    hop: Cpus | None
    proxy_cmd: str = DEFAULT_PROXY_CMD


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.real_server", description=__doc__)
    parser.add_argument(
        "--pairs", type=int, default=PAIRS, help=f"paired rounds per list (default {PAIRS}; 0: none)"
    )
    parser.add_argument("--duration", type=int, default=5, help="seconds per wrk measurement (default 5)")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured wrk seconds before each one")
    parser.add_argument(
        "--rounds", type=int, default=3, help="wrk rounds of every scenario (default 3; 0: none)"
    )
    parser.add_argument("--list-kb", type=int, default=LIST_BYTES // 1000, help="seeded list size")
    parser.add_argument("--pinning", choices=("split", "none"), default="split", help="as python -m bench")
    parser.add_argument(
        "--proxy-cmd", default=DEFAULT_PROXY_CMD, help="proxy command line template, as python -m bench"
    )
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="where real-latest.{md,json} go")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if not wrk.available():
        print("wrk not found (Debian: apt-get install -y wrk)", file=sys.stderr)
        return 2
    if args.duration < 1 or min(args.warmup, args.rounds, args.pairs) < 0 or args.rounds + args.pairs < 1:
        print("--duration must be at least 1; --warmup, --rounds and --pairs at least 0,", file=sys.stderr)
        print("and --rounds or --pairs above 0", file=sys.stderr)
        return 2
    settings = _settings(args)
    meta = metadata(settings)
    notes = [f"load average {os.getloadavg()[0]:.2f} at start: expect noise"] if _busy() else []
    started = time.monotonic()
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        paired, samples, sizes, memory = run(settings, args.list_kb * 1000, notes)
    except KeyboardInterrupt:
        print("interrupted: every process started was stopped", file=sys.stderr)
        return 130
    except (NotMeasurable, procs.StartupError, TargetUnavailable) as error:
        print(f"cannot measure: {error}", file=sys.stderr)
        return 1
    meta["run time"] = f"{time.monotonic() - started:.0f} s, seeding and restarts included"
    meta["seeded lists"] = ", ".join(f"{name} {kb:.0f} KB" for name, kb in sizes.items())
    meta["proxy RSS"] = memory
    publish(args.out, paired, samples, meta, notes)
    return 0


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    """Turn SIGTERM into SystemExit, so opencode, its tools and the proxy are stopped on the way out."""
    raise SystemExit(128 + signum)


def _busy() -> bool:
    return os.getloadavg()[0] > BUSY_LOAD


def _settings(args: argparse.Namespace) -> Settings:
    """The `split` layout of `python -m bench`: opencode, wrk and this process on the first CPU,
    the proxy on the others, so the proxy's work never takes CPU from opencode or wrk."""
    cpus = sorted(os.sched_getaffinity(0))
    split = args.pinning == "split" and len(cpus) >= 2
    load, hop = (frozenset(cpus[:1]), frozenset(cpus[1:])) if split else (None, None)
    return Settings(args.duration, args.warmup, args.rounds, args.pairs, load, hop, args.proxy_cmd)


def run(
    settings: Settings, list_bytes: int, notes: list[str]
) -> tuple[dict[str, PairedRun], list[Sample], dict[str, float], str]:
    """Seed on an unpinned server (faster), crash it, restart it pinned, measure through every path."""
    with tempfile.TemporaryDirectory(prefix="settle-real-bench-") as tmp, ExitStack() as stack:
        model = MockModel()
        model.start()
        stack.callback(model.stop)
        server = stack.enter_context(running_opencode(Path(tmp) / "opencode", model.base_url))
        _log(f"seeding four sessions of {list_bytes // 1000} KB (a few minutes)")
        scenarios = seed(server, model, list_bytes)
        if settings.load is not None:
            os.sched_setaffinity(0, settings.load)
        server.restart()
        ctx = TargetContext(server.url, REPO, Path(tmp), settings.hop, settings.proxy_cmd)
        proxy = start_proxy(ctx, stack)
        relay = start_relay(ctx, stack)
        endpoints = {"direct": Endpoint("direct", server.url), "relay": relay, "proxy": proxy}
        try:
            endpoints["nginx"] = start_nginx(ctx, stack)
        except TargetUnavailable as missing:
            notes.append(f"nginx: {missing}")
        sizes = {s.name: len(get(server.url + s.path).body) / 1000 for s in scenarios}
        paired = dict(_paired(scenarios, endpoints, settings, notes))
        samples = list(_rounds(scenarios, endpoints, settings, notes))
        return paired, samples, sizes, _memory(proxy)


def _paired(
    scenarios: list[Scenario], endpoints: dict[str, Endpoint], settings: Settings, notes: list[str]
) -> Iterator[tuple[str, PairedRun]]:
    """Each list checked, then measured in pairs: direct, the relay, nginx, the proxy, one request
    each in turn."""
    if not settings.pairs:
        return
    order = [endpoints[name] for name in ("direct", "relay", "nginx", "proxy") if name in endpoints]
    for scenario in scenarios:
        note = _checked(scenario, endpoints)
        notes.append(f"{scenario.name}: checked before the paired rounds, {note}")
        run = measure_pairs(scenario.path, order, settings.pairs, PAIR_WARMUP)
        medians = "  ".join(f"{name} {sorted(t)[len(t) // 2]:.2f} ms" for name, t in run.times_ms.items())
        _log(f"pairs {scenario.name:<15} {settings.pairs} rounds, p50: {medians}")
        yield scenario.name, run


def _checked(scenario: Scenario, endpoints: dict[str, Endpoint]) -> str:
    direct = get(endpoints["direct"].base_url + scenario.path)
    return check(scenario, direct, get(endpoints["proxy"].base_url + scenario.path))


def _rounds(
    scenarios: list[Scenario], endpoints: dict[str, Endpoint], settings: Settings, notes: list[str]
) -> Iterator[Sample]:
    for number in range(1, settings.rounds + 1):
        for scenario in scenarios:
            note = _checked(scenario, endpoints)
            if number == 1:
                notes.append(f"{scenario.name}: checked every round before measuring, {note}")
            present = [target for target in TARGETS if target in endpoints]
            order = present if number % 2 else present[::-1]
            for target in order:
                sample = measure(scenario, number, endpoints[target], settings)
                _log(f"round {number} {scenario.name:<15} {target:<6} {sample.rps:7.1f} req/s")
                yield sample


def measure(scenario: Scenario, number: int, endpoint: Endpoint, settings: Settings) -> Sample:
    url = endpoint.base_url + scenario.path
    body_kb = len(get(url).body) / 1000
    if settings.warmup:
        wrk.run(url, CONNECTIONS, settings.warmup, settings.load)
    before = _proxy_counts(endpoint)
    result = wrk.run(url, CONNECTIONS, settings.duration, settings.load)
    after = _proxy_counts(endpoint)
    upstream = None
    if before is not None and after is not None and after[0] > before[0]:
        upstream = 1 + (after[1] - before[1]) / (after[0] - before[0])
    figures = (result.rps, result.p50_ms, result.p99_ms, result.errors, upstream)
    return Sample(scenario.name, number, endpoint.name, body_kb, *figures)


def _proxy_counts(endpoint: Endpoint) -> tuple[float, float] | None:
    """(client requests, liveness look-ups) the proxy counted so far: each client request costs
    one upstream request plus its look-ups, so their growth over a run gives upstream req/req
    (1 in the steady state, where liveness comes from opencode's event stream)."""
    if not endpoint.rewrites:
        return None
    text = get(endpoint.base_url + "/_settle/metrics").body.decode()
    requests, lookups = (
        sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + "{"))
        for name in ("settle_proxy_requests_total", "settle_proxy_liveness_requests_total")
    )
    return requests, lookups


def _memory(proxy: Endpoint) -> str:
    if proxy.memory is None:
        return "-"
    now, peak = proxy.memory.rss_kib() / KIB_PER_MIB, proxy.memory.run_peak_kib() / KIB_PER_MIB
    return f"{proxy.memory.start_kib / KIB_PER_MIB:.1f} MiB at start, {now:.1f} at end, peak {peak:.1f}"


def metadata(settings: Settings) -> dict[str, str]:
    pinning = (
        f"split: opencode + wrk on CPU {_cpus(settings.load)}, the proxy on CPU {_cpus(settings.hop)}"
        if settings.load is not None and settings.hop is not None
        else "none"
    )
    return {
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "load average at start": " ".join(f"{x:.2f}" for x in os.getloadavg()) + " (should be near 0)",
        "pinning": pinning,
        "paired rounds": f"{settings.pairs} per list after {PAIR_WARMUP} unmeasured, one request per path"
        " in turn, the order rotated, each path on its own kept-alive connection",
        "per wrk measurement": f"{CONNECTIONS} connection, {settings.duration} s after {settings.warmup} s"
        " warm-up",
        "wrk rounds": f"{settings.rounds}; figures are the median (min-max) over them",
        "proxy command": settings.proxy_cmd,
        "command": shlex.join(["python", "-m", "bench.real_server", *sys.argv[1:]]),
    }


def _cpus(cpus: Cpus | None) -> str:
    return ",".join(map(str, sorted(cpus or ())))


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
