"""What the relay is given by the application that mounts it: its options and its metrics.

The relay is the lowest layer, so it defines what it needs and the service builds it from its
own settings and metrics registry, instead of the relay reaching up for them.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web
from prometheus_client import Counter, Gauge, Histogram
from yarl import URL


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


@dataclass(frozen=True, slots=True)
class RelayMetrics:
    """The metrics the relay keeps: requests by method and status, time to the upstream's
    headers, and the event streams and WebSockets open right now."""

    requests: Counter
    upstream_seconds: Histogram
    open_streams: Gauge


RELAY = web.AppKey("relay", RelayOptions)
RELAY_METRICS = web.AppKey("relay_metrics", RelayMetrics)
