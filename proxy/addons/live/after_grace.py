"""A confirmation's reading of the server, the grace period after it was asked for, and asked again
while it fails: right after a restart the server may not answer in time, and nothing else would
make the proxy ask again (the stream that came back says nothing more of the session).

Each try is bounded: a server that has just restarted can hold a request for good while it boots
the session's instance, and a confirmation that never ends holds back every later one of its
session (`confirmations`). A connection that drops mid-answer (the server killed again) is a
failed try like any other."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import aiohttp

from proxy.opencode.client import UpstreamRefused
from proxy.opencode.liveness import LivenessUnknown

ATTEMPTS = 3
"""Tries in all: after the grace period, then twice and four times it."""
TRY_TIMEOUT_S = 15.0
"""The longest one try may take (a v2 read of a large session takes well under a second)."""
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
            async with asyncio.timeout(TRY_TIMEOUT_S):
                return await read()
        except (UpstreamRefused, OSError, LivenessUnknown, aiohttp.ClientError) as error:
            why = str(error) or type(error).__name__
            log.info(
                "%s of %s: not confirmed (%s), try %d of %d",
                what,
                session_id,
                why,
                attempt,
                ATTEMPTS,
                extra={"fields": {"session": session_id, "why": why, "attempt": attempt}},
            )
        pause *= 2
    return None


def found_active(session_id: str, active: bool) -> bool:
    """Whether a confirmation's reading found the session active, in which case it tells nothing;
    said in the log, as a client then hears only what the server itself says."""
    if active:
        log.info(
            "live settle of %s: nothing said, the session is active",
            session_id,
            extra={"fields": {"session": session_id, "decision": "active"}},
        )
    return active
