"""The aiohttp application: the proxy's own routes, the catch-all forwarder, and the assembly of
what they use (`proxy.service.assembly`)."""

from __future__ import annotations

from collections.abc import Sequence

from aiohttp import web

from proxy.relay.headers import drop_invented_headers
from proxy.service.assembly import ADDONS, AddonFactory, Assembly
from proxy.service.auth import require_basic_auth
from proxy.service.config import Settings
from proxy.supervision.supervisor import Supervisor
from proxy.writeback.locations import locations

__all__ = ["ASSEMBLY", "create_app", "mount"]

ASSEMBLY = web.AppKey("assembly", Assembly)
"""The application's parts, for whoever holds only the application (tests, an embedding app)."""


def create_app(
    settings: Settings,
    *,
    supervisor: Supervisor | None = None,
    addons: Sequence[AddonFactory] = ADDONS,
) -> web.Application:
    """Build the proxy application for `settings`; run it with `aiohttp.web` as usual.

    `supervisor` is the server `settle-proxy run` started; `addons` the addons, in order (one
    more is one more factory). An unset `db_path` or `lock_dir` is its default location in
    this process's environment, found now. To embed settlement in an existing aiohttp
    application, use `mount` instead.
    """
    return _application(settings, supervisor=supervisor, addons=addons, prefix="")


def mount(parent: web.Application, prefix: str, settings: Settings) -> web.Application:
    """Serve the proxy under `prefix` of an existing application (e.g. "/opencode").

    Requests below the prefix reach the upstream without it; the proxy's lifecycle
    (upstream connections, write-back) follows the parent's start-up and cleanup. An unset
    `db_path` or `lock_dir` is found as `create_app` finds it.
    """
    prefix = "/" + prefix.strip("/")
    app = _application(settings, supervisor=None, addons=ADDONS, prefix=prefix)
    parent.add_subapp(prefix, app)
    return app


def _application(
    settings: Settings,
    *,
    supervisor: Supervisor | None,
    addons: Sequence[AddonFactory],
    prefix: str,
) -> web.Application:
    """The application, its parts given every location resolved (the command line's settings
    leave none unset, so its environment is the only one read)."""
    app = web.Application(middlewares=[require_basic_auth(*settings.auth)] if settings.auth else [])
    where = locations(settings.db_path, settings.lock_dir)
    assembly = app[ASSEMBLY] = Assembly(
        settings, addons=addons, supervisor=supervisor, prefix=prefix, where=where
    )
    app.cleanup_ctx.append(assembly.run)
    app.on_response_prepare.append(drop_invented_headers)
    app.on_shutdown.append(assembly.streams.cut)
    assembly.routes.add_to(app)
    # (?s): a path may hold an encoded line break, and the upstream must answer for it, not us.
    app.router.add_route("*", "/{tail:(?s:.*)}", assembly.forward)
    return app
