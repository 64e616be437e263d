"""The paired measurement of `python -m bench.real_server`: one request per path in turn.

Each round fetches a list once direct, once through nginx and once through the proxy, in an
order rotated from round to round (`pairs.rotated`), each path on its own kept-alive connection,
one request at a time; the time of each is from sending it to its body's last byte. The hops'
CPU time is read from /proc before and after the measured rounds. `pairs.figures` reads them.
"""

from __future__ import annotations

import http.client
import os
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from bench import pairs, procs
from bench.real_sessions import NotMeasurable
from bench.targets import Endpoint

TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class PairedRun:
    """One list's rounds: every request's time in ms by path (round i at index i), and the
    hops' CPU ms per request."""

    times_ms: dict[str, list[float]]
    cpu_ms_per_request: dict[str, float]


def measure_pairs(path: str, endpoints: list[Endpoint], rounds: int, warmup: int) -> PairedRun:
    """`warmup` unmeasured rounds, then `rounds` measured ones, of `path` through every endpoint."""
    connections = {e.name: _connection(e.base_url) for e in endpoints}
    names = list(connections)
    try:
        for number in range(warmup):
            for name in pairs.rotated(names, number):
                _timed(connections[name], path)
        watched = {e.name: e.memory.pid for e in endpoints if e.memory is not None}
        before = {name: procs.cpu_ticks(pid) for name, pid in watched.items()}
        times: dict[str, list[float]] = {name: [] for name in names}
        for number in range(rounds):
            for name in pairs.rotated(names, number):
                times[name].append(_timed(connections[name], path))
        after = {name: procs.cpu_ticks(pid) for name, pid in watched.items()}
    finally:
        for connection in connections.values():
            connection.close()
    per_second = os.sysconf("SC_CLK_TCK")
    cpu = {name: pairs.cpu_ms_per_request(before[name], after[name], per_second, rounds) for name in watched}
    return PairedRun(times, cpu)


def _connection(base_url: str) -> http.client.HTTPConnection:
    parts = urlsplit(base_url)
    return http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=TIMEOUT_S)


def _timed(connection: http.client.HTTPConnection, path: str) -> float:
    """One GET on the kept connection, in ms to the body's last byte."""
    started = time.perf_counter()
    connection.request("GET", path)
    response = connection.getresponse()
    body = response.read()
    elapsed_ms = (time.perf_counter() - started) * 1000
    if response.status != 200:
        where = f"{connection.host}:{connection.port}"
        raise NotMeasurable(f"GET {path} on {where} -> {response.status}: {body[:300]!r}")
    return elapsed_ms
