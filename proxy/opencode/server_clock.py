"""The upstream's clock, as its answers' `Date` headers show it.

Freshness compares a reading's time with the timestamps the server writes into messages, so
both must come from the server's clock: the proxy's own may be off by any amount (another
host, a container with its own clock, a clock set wrong). `Date` has a resolution of one
second and is truncated, and it is read after the answer was made, so both errors make a
reading look earlier than it was: a reading can only vouch for less, never for more.
"""

from __future__ import annotations

import time
from email.utils import parsedate_to_datetime


def parse_date(value: str | None) -> int | None:
    """An HTTP `Date` as epoch ms, or None when absent or unreadable."""
    if not value:
        return None
    try:
        moment = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return int(moment.timestamp()) * 1000 if moment.tzinfo is not None else None


class ServerClock:
    """The offset of the server's clock from ours, measured from every `Date` seen.

    Until a `Date` has been seen it is our clock: an upstream that sends none (opencode
    always does) leaves the proxy where it was before it measured anything.
    """

    def __init__(self) -> None:
        self._offset_ms = 0

    def observe(self, date: str | None) -> int | None:
        """The server's time an answer with this `Date` was made at (epoch ms), remembered
        as the current offset; None when the answer had no usable `Date`."""
        server = parse_date(date)
        if server is not None:
            self._offset_ms = server - _local_ms()
        return server

    def now(self) -> int:
        """The server's time now, as far as the last `Date` tells (epoch ms)."""
        return _local_ms() + self._offset_ms


def _local_ms() -> int:
    return int(time.time() * 1000)
