"""Helpers for testing addons and applications without a network or a sleep (as mitmproxy's
`mitmproxy.test`): a flow factory, one exchange through the real hook dispatcher, and waits
for background work and for the followed event stream.

    flow = testing.flow("GET", "/session/ses_1/message", body=stale)
    await testing.cycle(settle, flow)
    assert flow.response_headers["X-Settle-Settled"] == "1"

Tests that need to know something happened wait for it here; a sleep would be either too short
on a loaded machine or wasted on an idle one.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict
from prometheus_client import Counter
from yarl import URL

from proxy.addons.routing import Routing
from proxy.opencode.tracker import FollowedEvent, StreamListener
from proxy.relay.headers import upstream_request_headers
from proxy.relay.hooks import Addon, Addons, Flow
from proxy.service.app import ASSEMBLY
from proxy.service.config import Settings

WAIT_S = 10.0
"""How long a wait may take before the test fails: far beyond what any of them needs."""


DEFAULTS = Settings(upstream=URL("http://127.0.0.1:4096"))
_ERRORS = Counter("addon_errors", "Hooks that raised, by addon and hook.", ("addon", "hook"), registry=None)


def flow(
    method: str = "GET",
    path: str = "/",
    *,
    headers: Mapping[str, str] | None = None,
    status: int = 200,
    response_headers: Mapping[str, str] | None = None,
    body: bytes = b"",
    app: web.Application | None = None,
) -> Flow:
    """A flow as the relay builds it for a request, with the upstream's answer (`status`,
    `response_headers`, `body`) the hooks will see."""
    request = make_mocked_request(method, path, headers=headers, app=app or web.Application())
    made = Flow(request, upstream_request_headers(request), DEFAULTS.response_timeout)
    made.status = status
    made.response_headers = CIMultiDict(response_headers or {"Content-Type": "application/json"})
    made.content_length = len(body)
    made.body = body
    return made


def _dispatcher(addons: Addon | Sequence[Addon], flow: Flow) -> Addons:
    """The real dispatcher over `addons`, with `routing` first, as in the application, unless
    `addons` has it."""
    given = [addons] if isinstance(addons, Addon) else list(addons)
    if not any(isinstance(addon, Routing) for addon in given):
        given.insert(0, Routing())
    return Addons(given, _ERRORS)


async def cycle(addons: Addon | Sequence[Addon], flow: Flow) -> Flow:
    """Run `flow` through `addons` as the relay would, through the real dispatcher:
    `request_headers`, `response_headers`, `response` if an addon asked to read the body,
    and `done`, whatever happened before it."""
    dispatcher = _dispatcher(addons, flow)
    try:
        await dispatcher.trigger("request_headers", flow)
        await dispatcher.trigger("response_headers", flow)
        if flow.reads_whole:
            await dispatcher.trigger("response", flow)
    finally:
        await dispatcher.trigger("done", flow)
    return flow


@asynccontextmanager
async def streaming(addons: Addon | Sequence[Addon], flow: Flow) -> AsyncIterator[Flow]:
    """A flow whose body is being streamed (an event stream): `request_headers` and
    `response_headers` on entering, `done` on leaving, as when the stream ends."""
    dispatcher = _dispatcher(addons, flow)
    try:
        await dispatcher.trigger("request_headers", flow)
        await dispatcher.trigger("response_headers", flow)
        yield flow
    finally:
        await dispatcher.trigger("done", flow)


async def idle(app: web.Application) -> None:
    """Wait until the application's background work (confirmations, write-backs) is done."""
    async with asyncio.timeout(WAIT_S):
        await app[ASSEMBLY].background.idle()


class _Hearing(StreamListener):
    """Sets `heard` on the first event `wanted` takes, or on (re)connection when it is None."""

    def __init__(self, wanted: Callable[[FollowedEvent], bool] | None) -> None:
        self._wanted = wanted
        self.heard = asyncio.Event()

    def following(self) -> None:
        if self._wanted is None:
            self.heard.set()

    def event(self, event: FollowedEvent) -> None:
        if self._wanted is not None and self._wanted(event):
            self.heard.set()


@asynccontextmanager
async def _listening(app: web.Application, listener: _Hearing) -> AsyncIterator[None]:
    """The tracker hands each event to its listeners in order, so once this one (added last)
    has it, every addon has too."""
    listeners = app[ASSEMBLY].started.tracker.listeners
    listeners.append(listener)
    try:
        yield
        async with asyncio.timeout(WAIT_S):
            await listener.heard.wait()
    finally:
        listeners.remove(listener)


def hearing(
    app: web.Application, kind: str, session_id: str | None = None
) -> AbstractAsyncContextManager[None]:
    """Wait, when the block ends, until the application's listeners were given an event `kind`
    (about `session_id`) that the upstream sent meanwhile."""
    return _listening(
        app, _Hearing(lambda event: event.kind == kind and session_id in (None, event.session_id))
    )


def refollowing(app: web.Application) -> AbstractAsyncContextManager[None]:
    """Wait, when the block ends, until the application follows the upstream's event stream
    anew (the block ends the stream it followed, as a crashing server does)."""
    return _listening(app, _Hearing(None))
