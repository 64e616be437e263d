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
from typing import Any

from aiohttp import web

CHECK_EVERY_S = 1.0


class Departures:
    """The exchanges an application is running, and the one timer that checks their clients."""

    def __init__(self) -> None:
        self._running: dict[asyncio.Task[Any], web.Request] = {}
        self._timer: asyncio.TimerHandle | None = None

    def watching(self, request: web.Request) -> _Watch:
        """While the block runs, the current task is cancelled if `request`'s client goes away."""
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("watching() needs a running task")
        self._running[task] = request
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(CHECK_EVERY_S, self._check)
        return _Watch(self._running, task)

    def _check(self) -> None:
        self._timer = None
        for task, request in list(self._running.items()):
            if request.transport is None and not task.cancelling():
                del self._running[task]
                task.cancel("the client went away")
        if self._running:
            self._timer = asyncio.get_running_loop().call_later(CHECK_EVERY_S, self._check)


class _Watch:
    """The block `watching` guards; a class, not a generator, because it runs on every request."""

    __slots__ = ("_running", "_task")

    def __init__(self, running: dict[asyncio.Task[Any], web.Request], task: asyncio.Task[Any]) -> None:
        self._running, self._task = running, task

    def __enter__(self) -> None:
        pass

    def __exit__(self, *_: object) -> None:
        self._running.pop(self._task, None)
