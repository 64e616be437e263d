"""Prometheus metrics, one registry per application so that embedded copies never collide.

Served at `/_settle/metrics` in the Prometheus text format (prometheus-client: the format,
its escaping and histogram buckets are its job, not ours).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from proxy.opencode.tracker import StreamMetrics
from proxy.relay.options import RelayMetrics

__all__ = ["CONTENT_TYPE_LATEST", "Metrics"]


class Metrics:
    """Every metric the proxy keeps."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.relay = _relay_metrics(self.registry)
        self.rewrites = Counter(
            "settle_proxy_rewrites",
            "Changes made to message views (applied=false: --dry-run).",
            ("rule", "api", "applied"),
            registry=self.registry,
        )
        self.write_backs = Counter(
            "settle_proxy_write_backs",
            "Write-back passes, by mode and outcome.",
            ("mode", "outcome"),
            registry=self.registry,
        )
        self.liveness_requests = Counter(
            "settle_proxy_liveness_requests",
            "Liveness look-ups made upstream (for views, write-back, live settle and session streams).",
            ("api",),
            registry=self.registry,
        )
        self.stream = _stream_metrics(self.registry)
        self.injected_events = Counter(
            "settle_proxy_injected_events",
            "Events slipped into client event streams by live settlement.",
            registry=self.registry,
        )
        self.withdrawn_confirmations = Counter(
            "settle_proxy_withdrawn_confirmations",
            "Confirmations that announced nothing because the stream spoke of their session meanwhile.",
            ("confirmation",),
            registry=self.registry,
        )
        self.addon_errors = Counter(
            "settle_proxy_addon_errors",
            "Addon hooks that raised (the flow went on without their changes), by addon and hook.",
            ("addon", "hook"),
            registry=self.registry,
        )
        self.orphans = Gauge(
            "settle_proxy_orphans",
            "Processes a dead server left running (under settle-proxy run).",
            registry=self.registry,
        )
        self.stalled_calls = Gauge(
            "settle_proxy_stalled_calls",
            "Tool calls shown running whose own process has exited while one it started holds their output.",
            registry=self.registry,
        )
        self.stall_aborts = Counter(
            "settle_proxy_stall_aborts",
            "Stalled calls ended through the server's abort (--stall-abort), by outcome (sent, failed).",
            ("outcome",),
            registry=self.registry,
        )
        self.background_busy = Gauge(
            "settle_proxy_background_busy",
            "1 while a confirmation, a write-back pass or a resume is under way; 0 once all decided.",
            registry=self.registry,
        )

    def exposition(self) -> bytes:
        """The text exposition of every metric."""
        return generate_latest(self.registry)


def _relay_metrics(registry: CollectorRegistry) -> RelayMetrics:
    """What the relay keeps, handed to it as one."""
    return RelayMetrics(
        Counter(
            "settle_proxy_requests",
            "Client requests forwarded, by method and status.",
            ("method", "status"),
            registry=registry,
        ),
        Histogram(
            "settle_proxy_upstream_seconds",
            "Time until the upstream's response headers arrived.",
            registry=registry,
        ),
        Gauge(
            "settle_proxy_open_streams",
            "Event streams and WebSockets open right now.",
            registry=registry,
        ),
    )


def _stream_metrics(registry: CollectorRegistry) -> StreamMetrics:
    """What the tracker of `/global/event` keeps, handed to it as one."""
    return StreamMetrics(
        Counter(
            "settle_proxy_unreadable_events",
            "Events of /global/event skipped because they could not be read, by reason.",
            ("reason",),
            registry=registry,
        ),
        Counter(
            "settle_proxy_stream_listener_errors",
            "Listeners of /global/event that raised (the others still got the event).",
            ("listener", "hook"),
            registry=registry,
        ),
        Counter(
            "settle_proxy_event_stream_restarts",
            "Times following /global/event failed in the proxy itself and was started again.",
            registry=registry,
        ),
    )
