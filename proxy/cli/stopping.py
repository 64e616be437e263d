"""How a signal stops the proxy, and the line that says it did.

The first SIGTERM or SIGINT stops it in order: it stops accepting, cuts the open streams, gives
requests under way about a second, and only then stops a supervised server (SIGTERM) and what that
left running. A second one stops it at once: the server's process group and what it left are
SIGKILLed, and the proxy exits with 128 + the signal's number, as a shell reports a signal's
death. Once stopped, one line says on which signal, what was stopped, and how long it took.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time

from proxy.supervision.supervisor import Supervisor

log = logging.getLogger("proxy")


class Stopping:
    """The proxy's stop: `requested` once a signal came; a second signal ends it at once."""

    def __init__(self, supervisor: Supervisor | None) -> None:
        self.requested = asyncio.Event()
        self._supervisor = supervisor
        self._signal: str | None = None
        self._began = 0.0

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._signalled, signum)

    def _signalled(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if not self.requested.is_set():
            self._signal, self._began = name, time.monotonic()
            log.info("%s: stopping (%s again stops at once)", name, name)
            self.requested.set()
            return
        log.warning("%s again: stopping at once (SIGKILL)", name)
        if self._supervisor is not None:
            self._supervisor.kill_now()
        logging.shutdown()
        os._exit(128 + signum)

    def said(self) -> None:
        """The shutdown line, when a signal stopped the proxy."""
        if self._signal is None:
            return
        stopped = ["the proxy", *(self._supervisor.stopped if self._supervisor is not None else ())]
        took = time.monotonic() - self._began
        log.info("stopped on %s in %.1f s: %s", self._signal, took, ", ".join(stopped))
