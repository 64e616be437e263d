"""What a resume sees of the clients watching through the proxy's event streams: how many were
open around the crash, and a wait until as many are back (`proxy.addons.resume_clients` counts
them; the service hands that addon to the resume, which cannot import addons)."""

from __future__ import annotations

from typing import Protocol

__all__ = ["CLIENTS_BACK_S", "Clients"]

CLIENTS_BACK_S = 30.0
"""The longest a resume waits for the client streams the crash cut to be back."""


class Clients(Protocol):
    """The client streams a resume waits for (`proxy.addons.resume_clients.ResumeClients`)."""

    @property
    def open(self) -> int: ...

    def most_open_since(self, moment: float) -> int:
        """The most client streams open at any time from `moment` (`time.monotonic()`) on."""

    async def back(self, count: int) -> None:
        """Wait until at least `count` client streams are open (the caller bounds the wait)."""
