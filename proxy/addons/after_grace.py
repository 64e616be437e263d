"""A confirmation's reading of the server, the grace period after it was asked for, and asked
again while it fails: right after a restart the server may not answer in time, and nothing else
would make the proxy ask again (the stream that came back says nothing more of the session)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from proxy.opencode.client import UpstreamRefused
from proxy.opencode.liveness import LivenessUnknown

ATTEMPTS = 3
"""Tries in all: after the grace period, then twice and four times it."""
T = TypeVar("T")
log = logging.getLogger(__name__)


async def read_after_grace(
    read: Callable[[], Awaitable[T]], grace: float, what: str, session_id: str
) -> T | None:
    """What `read()` returns once it answers, or None when every try failed (each one logged)."""
    pause = grace
    for attempt in range(1, ATTEMPTS + 1):
        await asyncio.sleep(pause)
        try:
            return await read()
        except (UpstreamRefused, OSError, LivenessUnknown) as error:
            log.info(
                "%s of %s: not confirmed (%s), try %d of %d",
                what,
                session_id,
                error,
                attempt,
                ATTEMPTS,
                extra={"fields": {"session": session_id, "why": str(error), "attempt": attempt}},
            )
        pause *= 2
    return None
