"""The addon model: each behaviour is a small named object with hooks, as in mitmproxy.

The forwarding core calls the hooks through `Addons`, at fixed points of an exchange, and
knows none of the addons. An addon that needs a whole response body says so in
`response_headers`; every other body is streamed through untouched.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from aiohttp import web
from multidict import CIMultiDict
from prometheus_client import Counter

log = logging.getLogger(__name__)
Hook = Literal["request_headers", "response_headers", "response", "done"]


@dataclass(slots=True)
class Flow:
    """One request/response exchange as addons see it."""

    request: web.Request
    upstream_headers: CIMultiDict[str]
    """The headers about to be sent upstream; `request_headers` hooks may edit them."""
    status: int = 0
    response_headers: CIMultiDict[str] = field(default_factory=CIMultiDict)
    content_length: int | None = None
    """The upstream body's announced length, if it announced one."""
    read_body: bool = False
    """Set by a `response_headers` hook to receive the whole body in `response`."""
    body: bytes = b""
    inject: asyncio.Queue[bytes] | None = None
    """Set by a `response_headers` hook on an event stream: events to slip in between the upstream's."""

    @property
    def event_stream(self) -> bool:
        """Whether the response is a server-sent event stream (known once its headers are)."""
        return self.response_headers.get("Content-Type", "").startswith("text/event-stream")


class Addon:
    """Base class with no-op hooks; subclasses override the hooks they handle."""

    name: ClassVar[str]

    async def request_headers(self, flow: Flow) -> None:
        """Before the request goes upstream."""

    async def response_headers(self, flow: Flow) -> None:
        """When the upstream status and headers are known, before any body byte is read."""

    async def response(self, flow: Flow) -> None:
        """With the whole body, for flows some addon asked to read; may replace body and headers."""

    async def done(self, flow: Flow) -> None:
        """The exchange is over (answered, streamed to the end, or abandoned by the client)."""


@dataclass(frozen=True, slots=True)
class _Snapshot:
    """What a hook may change in a flow, taken before the hook runs, to undo a failed one."""

    upstream_headers: CIMultiDict[str]
    status: int
    response_headers: CIMultiDict[str]
    read_body: bool
    body: bytes
    inject: asyncio.Queue[bytes] | None

    @classmethod
    def of(cls, flow: Flow) -> _Snapshot:
        return cls(
            flow.upstream_headers.copy(),
            flow.status,
            flow.response_headers.copy(),
            flow.read_body,
            flow.body,
            flow.inject,
        )

    def restore(self, flow: Flow) -> None:
        flow.upstream_headers = self.upstream_headers
        flow.status, flow.response_headers = self.status, self.response_headers
        flow.read_body, flow.body, flow.inject = self.read_body, self.body, self.inject


class Addons:
    """The addons of one application, in order, and the one place their hooks are called.

    A hook that raises is isolated: it is logged and counted, whatever it changed in the flow
    is undone (so the client gets the upstream's bytes, never a 500 made by the proxy), and the
    other addons run on. Only the addons that implement a hook are called for it.
    """

    def __init__(self, addons: Sequence[Addon], errors: Counter) -> None:
        self._errors = errors
        self._implementing = {
            hook: tuple(addon for addon in addons if getattr(type(addon), hook) is not getattr(Addon, hook))
            for hook in ("request_headers", "response_headers", "response", "done")
        }

    async def trigger(self, hook: Hook, flow: Flow) -> None:
        """Call `hook` of every addon that has it, in order, each isolated from the others."""
        for addon in self._implementing[hook]:
            method: Callable[[Flow], Coroutine[Any, Any, None]] = getattr(addon, hook)
            snapshot = _Snapshot.of(flow) if hook != "done" else None
            try:
                await method(flow)
            except Exception:
                log.exception(
                    "addon %s failed in %s of %s; what it changed is undone",
                    addon.name,
                    hook,
                    flow.request.path,
                )
                self._errors.labels(addon.name, hook).inc()
                if snapshot is not None:
                    snapshot.restore(flow)
