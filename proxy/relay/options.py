"""What the relay is given by the application that mounts it: its options and its metrics.

The relay is the lowest layer, so it defines what it needs and the service builds it from its
own settings and metrics registry, instead of the relay reaching up for them.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import Counter, Gauge, Histogram
from yarl import URL

DEFAULT_MAX_BODY = 64 * 2**20
"""The most bytes of a body read whole to be checked, as sent and decoded: 64 MiB, some 140 times
a real 40-turn message list (444 KB), so a session of a thousand long turns still fits."""


@dataclass(frozen=True, slots=True)
class RelayOptions:
    """The part of the configuration the relay uses."""

    upstream_origin: URL
    """The upstream without credentials or path: where requests go, and safe to show in errors."""
    connect_timeout: float
    """Seconds to open an upstream connection before answering 502."""
    response_timeout: float | None = None
    """Seconds a plain exchange may wait on the upstream for its headers, then for each next
    piece of its body (None: no limit)."""
    max_body: int = DEFAULT_MAX_BODY
    """The most bytes of a body read whole, as sent and decoded; a larger one is streamed unchecked."""


@dataclass(frozen=True, slots=True)
class RelayMetrics:
    """The metrics the relay keeps: requests by method and status, time to the upstream's
    headers, and the event streams and WebSockets open right now."""

    requests: Counter
    upstream_seconds: Histogram
    open_streams: Gauge
