"""What a stop does to the exchanges under way.

An event stream or a WebSocket never ends by itself, so a stop that waits for it waits out its
whole timeout (aiohttp's is 60 s, spent twice). A stop cuts them at once instead, the way a crash
would: the connection is closed without a last chunk, so a client takes it for a failure and
reconnects (the JS SDK reconnects only after an error), and never for the server's "no more".
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from aiohttp import web


class OpenStreams:
    """The exchanges that never end by themselves, to cut when the application stops."""

    def __init__(self) -> None:
        self._open: dict[asyncio.Task[Any], web.Request] = {}

    def __len__(self) -> int:
        return len(self._open)

    @contextmanager
    def holding(self, request: web.Request) -> Iterator[None]:
        """While the block runs, a stop cuts `request`'s connection and cancels the current task."""
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("holding() needs a running task")
        self._open[task] = request
        try:
            yield
        finally:
            self._open.pop(task, None)

    async def cut(self, _app: web.Application | None = None) -> None:
        """Cut every open stream (an `on_shutdown` hook: the sites no longer accept by then): its
        socket is closed with what is still unsent, and its handler cancelled, so its upstream
        request ends too."""
        for task, request in list(self._open.items()):
            if request.transport is not None:
                request.transport.abort()
            task.cancel("the proxy is stopping")
        self._open.clear()
