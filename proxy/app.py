"""The aiohttp application: one catch-all route, the upstream session and the addons."""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from proxy.addons import Addon
from proxy.config import Settings
from proxy.forward import ADDONS, forward
from proxy.liveness import LivenessProbe
from proxy.settle import Settle
from proxy.upstream import SETTINGS, UPSTREAM, upstream_session
from proxy.upstream_api import UpstreamApi


def default_addons(app: web.Application) -> list[Addon]:
    """The addons a stand-alone proxy runs, in hook order."""
    return [Settle(LivenessProbe(UpstreamApi(app[UPSTREAM], app[SETTINGS]), app[SETTINGS]))]


async def _addons(app: web.Application) -> AsyncIterator[None]:
    app[ADDONS] = default_addons(app)
    yield


def create_app(settings: Settings) -> web.Application:
    """Build the proxy application for `settings`; run it with `aiohttp.web` as usual."""
    app = web.Application()
    app[SETTINGS] = settings
    app.cleanup_ctx.extend((upstream_session, _addons))
    app.router.add_route("*", "/{tail:.*}", forward)
    return app
