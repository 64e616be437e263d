"""What the addons that settle event streams share: where to ask, how long to wait, what to count."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client import Counter

from proxy.opencode.client import Credentials, UpstreamApi
from proxy.opencode.liveness import LivenessProbe
from proxy.writeback.scheduler import WriteBack
from rules import Api, Target

ViewListener = Callable[[Api, str, frozenset[Target]], None]
"""Told the runtime, the session and what the rules changed in a view the settle addon settled."""


@dataclass(slots=True)
class SettledViews:
    """Who hears that a message view was settled: a client that kept its state from a stream (the
    TUI, which never fetches again) must be told too, though only another client fetched."""

    listeners: list[ViewListener] = field(default_factory=list)

    def settled(self, api: Api, session_id: str, targets: frozenset[Target]) -> None:
        for listener in self.listeners:
            listener(api, session_id, targets)


class SettleMetrics(Protocol):
    """The counters the settling addons add to; the service's `Metrics` has them (and more)."""

    @property
    def rewrites(self) -> Counter: ...

    @property
    def injected_events(self) -> Counter: ...

    @property
    def withdrawn_confirmations(self) -> Counter: ...


@dataclass(frozen=True, slots=True)
class SettleContext:
    """One per application, built with its addons; every settling addon takes it (and,
    keyword-only, what it alone uses).

    `grace` is how long an orphan must stay one before clients are told; `credentials` are the
    configured ones, for what the addons ask on their own (no client request to borrow from);
    `write_back` is None when write-back is off; with `dry_run` the addons decide and log, but
    tell and write nothing.
    """

    probe: LivenessProbe
    upstream: UpstreamApi
    metrics: SettleMetrics
    grace: float
    credentials: Credentials = field(default_factory=Credentials)
    write_back: WriteBack | None = None
    dry_run: bool = False
    views: SettledViews = field(default_factory=SettledViews)
