"""The freshness margin, waited out in the server's own clock.

The proxy leaves a tool open when it was alive less than `FRESH_MARGIN_MS` before a reading, in
the server's `Date` clock (whole seconds). A scene whose first fetch must settle waits here first,
on the same clock the proxy reads, instead of sleeping.
"""

from __future__ import annotations

from proxy.opencode.server_clock import parse_date
from rules.liveness import FRESH_MARGIN_MS

from .http_client import request
from .polling import poll


def wait_past_freshness(server_url: str, since_ms: int) -> None:
    """Return once the server's own clock, read from its `Date` as the proxy reads it, is past
    `FRESH_MARGIN_MS` after `since_ms`: a reading the proxy takes from then on vouches for anything
    last alive before `since_ms` (a crash), so a first fetch settles it."""

    def past() -> bool | None:
        now = parse_date(request("GET", server_url + "/global/health").headers.get("Date"))
        return True if now is not None and now > since_ms + FRESH_MARGIN_MS else None

    poll(past, what="the server's clock past the freshness margin of the crash", timeout=10)
