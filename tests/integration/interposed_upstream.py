"""The upstream as an in-process writer sees it, with a test's step put in front of its calls:
how a test lands another client's request between a writer's read and its write, for certain."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

from proxy.opencode.client import Credentials, UpstreamApi

Send = Callable[[], Awaitable[Any]]
"""The writer's own call, as it would have gone to the server."""


class InterposedUpstream(UpstreamApi):
    """`UpstreamApi` whose every call goes through `around`, which by default just sends it."""

    async def call(self, method: str, path: str, credentials: Credentials, **options: Any) -> Any:
        send = functools.partial(super().call, method, path, credentials, **options)
        return await self.around(method, path, credentials, options.get("json"), send)

    async def around(self, method: str, path: str, credentials: Credentials, json: Any, send: Send) -> Any:
        """What the test does around one call of the writer's; `send` makes the call itself."""
        del method, path, credentials, json
        return await send()

    async def send_directly(self, method: str, path: str, credentials: Credentials, json: Any = None) -> Any:
        """A call of the test's own, past `around`."""
        return await super().call(method, path, credentials, json=json)
