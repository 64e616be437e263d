"""The aiohttp application: one catch-all route, the upstream session and the addons."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

from aiohttp import web

from proxy.addons import Addon
from proxy.api_writer import ApiWriter
from proxy.config import Settings, WriteBackMode
from proxy.database import OpencodeDatabase, default_path
from proxy.db_writer import DbWriter
from proxy.forward import ADDONS, forward
from proxy.liveness import LivenessProbe
from proxy.settle import Settle
from proxy.upstream import SETTINGS, UPSTREAM, upstream_session
from proxy.upstream_api import UpstreamApi
from proxy.writeback import WriteBack, Writer

WRITE_BACK = web.AppKey("write_back", WriteBack)


async def _writer(settings: Settings, upstream: UpstreamApi, stack: AsyncExitStack) -> Writer | None:
    if settings.write_back is WriteBackMode.API:
        return ApiWriter(upstream)
    if settings.write_back is WriteBackMode.DB:
        database = await stack.enter_async_context(OpencodeDatabase.open(settings.db_path or default_path()))
        return DbWriter(database)
    return None


async def _addons(app: web.Application) -> AsyncIterator[None]:
    """`cleanup_ctx` entry: the addons a stand-alone proxy runs, and what they own."""
    settings = app[SETTINGS]
    upstream = UpstreamApi(app[UPSTREAM], settings)
    probe = LivenessProbe(upstream, settings)
    async with AsyncExitStack() as stack:
        writer = await _writer(settings, upstream, stack)
        write_back = None
        if writer is not None:
            write_back = app[WRITE_BACK] = WriteBack(probe, writer, settings.grace)
            stack.push_async_callback(write_back.close)
        addons: list[Addon] = [Settle(probe, write_back=write_back)]
        app[ADDONS] = addons
        yield


def create_app(settings: Settings) -> web.Application:
    """Build the proxy application for `settings`; run it with `aiohttp.web` as usual."""
    app = web.Application()
    app[SETTINGS] = settings
    app.cleanup_ctx.extend((upstream_session, _addons))
    app.router.add_route("*", "/{tail:.*}", forward)
    return app
