"""One measurement of one scenario through one target: HTTP with wrk, SSE latency, downloads,
and the intermediary's memory over the whole run."""

from __future__ import annotations

import json
import statistics
import subprocess
import urllib.request

import aiohttp

from bench import stream, wrk
from bench.procs import PeakRss
from bench.report import Row
from bench.scenarios import DownloadScenario, HttpScenario, Scenario, SseScenario
from bench.settings import Settings
from bench.shapes import Variant
from bench.targets import Endpoint

KIB_PER_MIB = 1024
MEASUREMENT_ERRORS = (wrk.WrkError, OSError, aiohttp.ClientError, ValueError, subprocess.SubprocessError)
"""What a failed measurement raises: its row says so, and the run goes on."""


def measure_one(scenario: Scenario, endpoint: Endpoint, upstream: str, settings: Settings) -> Row:
    if isinstance(scenario, HttpScenario):
        return measure_http(scenario, endpoint, upstream, settings)
    if isinstance(scenario, SseScenario):
        return measure_sse(scenario, endpoint, settings)
    return measure_download(scenario, endpoint, settings)


def kind(scenario: Scenario) -> str:
    return {HttpScenario: "http", SseScenario: "sse", DownloadScenario: "download"}[type(scenario)]


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
