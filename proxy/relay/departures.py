"""Noticing a client that went away by itself, whatever the application the relay runs in.

aiohttp cancels the handler of a client that went away only when it runs with
`handler_cancellation=True`, as the command line does; `web.run_app` and `AppRunner` default to
False (since aiohttp 3.8), and then a handler relaying a quiet event stream or waiting on a slow
upstream hears of it only on a write that may never come, and holds its upstream request open
for good. aiohttp offers no event for it, but a lost connection drops the request's transport:
so once a second, while any exchange runs, each is looked at, and one whose client is gone is
cancelled as aiohttp would have cancelled it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from aiohttp import web

CHECK_EVERY_S = 1.0


class Departures:
    """The exchanges an application is running, and the one timer that checks their clients."""

    def __init__(self) -> None:
        self._running: dict[asyncio.Task[Any], web.Request] = {}
        self._timer: asyncio.TimerHandle | None = None

    @contextmanager
    def watching(self, request: web.Request) -> Iterator[None]:
        """While the block runs, the current task is cancelled if `request`'s client goes away."""
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("watching() needs a running task")
        self._running[task] = request
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(CHECK_EVERY_S, self._check)
        try:
            yield
        finally:
            self._running.pop(task, None)

    def _check(self) -> None:
        self._timer = None
        for task, request in list(self._running.items()):
            if request.transport is None and not task.cancelling():
                del self._running[task]
                task.cancel("the client went away")
        if self._running:
            self._timer = asyncio.get_running_loop().call_later(CHECK_EVERY_S, self._check)


DEPARTURES = web.AppKey("departures", Departures)
