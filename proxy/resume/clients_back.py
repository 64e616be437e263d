"""What a resume sees of the clients watching through the proxy's event streams: how many were
open around the crash, and a wait until as many are back (`proxy.addons.live.resume_clients` counts
them; the service hands that addon to the resume, which cannot import addons)."""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

__all__ = ["CLIENTS_BACK_S", "Clients", "clients_back"]

log = logging.getLogger(__name__)
CLIENTS_BACK_S = 30.0
"""The longest a resume waits for the client streams the crash cut to be back."""


class Clients(Protocol):
    """The client streams a resume waits for (`proxy.addons.live.resume_clients.ResumeClients`)."""

    @property
    def open(self) -> int: ...

    def most_open_since(self, moment: float) -> int:
        """The most client streams open at any time from `moment` (`time.monotonic()`) on."""

    async def back(self, count: int) -> None:
        """Wait until at least `count` client streams are open (the caller bounds the wait)."""


async def clients_back(clients: Clients, session_id: str, last_alive: float) -> None:
    """Wait (bounded by `CLIENTS_BACK_S`) for as many client streams as were open from when the
    server was last heard (`last_alive`) until the crash; say in the log how many came back."""
    watching = clients.most_open_since(last_alive)
    fields = {"session": session_id, "watching": watching}
    try:
        async with asyncio.timeout(CLIENTS_BACK_S):
            await clients.back(watching)
    except TimeoutError:
        log.info(
            "resume of %s goes ahead with %d of %d client stream(s) back after %g s",
            session_id,
            clients.open,
            watching,
            CLIENTS_BACK_S,
            extra={"fields": fields},
        )
        return
    log.info(
        "resume of %s goes ahead: %d client stream(s) open, of %d open at the crash",
        session_id,
        clients.open,
        watching,
        extra={"fields": fields},
    )
