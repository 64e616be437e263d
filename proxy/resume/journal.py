"""Every resume decision, seen and counted: one structured log line, a metric by outcome, and the
recent ones for `GET /_settle/resume`."""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter

from proxy.resume.decision import ResumeOutcome
from rules import Api

__all__ = ["Journal"]

log = logging.getLogger("proxy.resume")
RECENT = 50


class Journal:
    """Logs, counts and keeps the recent decisions; `enabled` (whether `--resume` runs: asked for,
    with a ledger) and `dry_run` are shown with them, as built."""

    def __init__(self, registry: CollectorRegistry, *, enabled: bool, dry_run: bool) -> None:
        self.enabled: Final = enabled
        self.dry_run: Final = dry_run
        self.resumes = Counter(
            "settle_proxy_resumes",
            "Resume decisions about interrupted turns, by outcome (--resume).",
            ("outcome",),
            registry=registry,
        )
        self._recent: deque[dict[str, Any]] = deque(maxlen=RECENT)

    def decided(
        self,
        outcome: ResumeOutcome,
        api: Api,
        session_id: str,
        why: str,
        *,
        message: str | None = None,
        **more: Any,
    ) -> None:
        fields = {
            "outcome": str(outcome),
            "session": session_id,
            "message": message,
            "api": str(api),
            "why": why,
            **more,
        }
        self.resumes.labels(str(outcome)).inc()
        self._recent.append({"at": time.time(), **fields})
        unsent = outcome in (ResumeOutcome.NOT_STARTED, ResumeOutcome.GAVE_UP)
        level = logging.WARNING if unsent else logging.INFO
        log.log(level, "resume %s: session %s: %s", outcome, session_id, why, extra={"fields": fields})

    def recent(self) -> list[dict[str, Any]]:
        return list(self._recent)
