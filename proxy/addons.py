"""The addon model: each behaviour is a small named object with hooks, as in mitmproxy.

The forwarding core walks the addons at fixed points of an exchange and knows none of
them. An addon that needs a whole response body says so in `response_headers`; every
other body is streamed through untouched.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import ClassVar

from aiohttp import web
from multidict import CIMultiDict


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
