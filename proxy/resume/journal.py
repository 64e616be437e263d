"""Every resume decision, seen and counted: one structured log line, a metric by outcome, and the
recent ones for `GET /_settle/resume`."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter

from proxy.resume.decision import ResumeOutcome
from rules import Api

__all__ = ["JOURNAL", "Journal", "resume_route"]

log = logging.getLogger("proxy.resume")
RECENT = 50


class Journal:
    """Logs, counts and keeps the recent decisions; `enabled` and `dry_run` are shown with them."""

    def __init__(self, registry: CollectorRegistry, *, enabled: bool, dry_run: bool) -> None:
        self.enabled = enabled
        self.dry_run = dry_run
        self.resumes = Counter(
            "settle_proxy_resumes",
            "Resume decisions about interrupted turns, by outcome (--resume).",
            ("outcome",),
            registry=registry,
        )
        self._recent: deque[dict[str, Any]] = deque(maxlen=RECENT)
        self.running: Callable[[], list[str]] = list
        """The sessions the followed stream shows in a turn (set once the watch exists)."""

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


JOURNAL = web.AppKey("resume_journal", Journal)


async def resume_route(request: web.Request) -> web.Response:
    """`GET /_settle/resume`: whether resume is on, the sessions it would consider should the server
    die now (`running`), and its recent decisions, oldest first."""
    journal = request.app.get(JOURNAL)
    if journal is None:
        return web.json_response({"enabled": False, "dry_run": False, "running": [], "decisions": []})
    return web.json_response(
        {
            "enabled": journal.enabled,
            "dry_run": journal.dry_run,
            "running": journal.running(),
            "decisions": journal.recent(),
        }
    )
