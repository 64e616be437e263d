"""The relay alone: the proxy's own stack with no addons, the floor the proxy is measured against.

`python -m bench.bare_relay --upstream URL --port N` serves what `python -m proxy` serves, built
from the same parts and run the same way (the proxy's `app_runner`, uvloop, glibc's heap
thresholds fixed), except that its `Forwarder` is given no
addons: every body streams through `relay.transport.Transport` as it arrives, none is read
whole, and nothing follows the upstream's events. The proxy against it is then the cost of the
addons; it against direct, the cost of the stack.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import AsyncIterator, Sequence

import uvloop
from aiohttp import web
from yarl import URL

from proxy.cli.main import app_runner
from proxy.relay.departures import DEPARTURES, Departures
from proxy.relay.forward import Forwarder
from proxy.relay.headers import drop_invented_headers
from proxy.relay.hooks import Addons
from proxy.relay.options import RELAY, RELAY_METRICS, RelayOptions
from proxy.relay.upstream import upstream_session
from proxy.service.config import Settings
from proxy.service.metrics import Metrics
from proxy.system.heap import keep_freed_bodies


def relay_app(upstream: URL) -> web.Application:
    """The proxy's application (`service.app.create_app`) less its addons and its own routes."""
    defaults = Settings(upstream=upstream)
    app = web.Application()
    metrics = Metrics()
    app[RELAY] = RelayOptions(
        defaults.upstream_origin, defaults.connect_timeout, defaults.response_timeout, defaults.max_body
    )
    app[RELAY_METRICS] = metrics.relay
    app[DEPARTURES] = departures = Departures()
    forwarder = Forwarder(app[RELAY], metrics.relay, departures)

    async def no_addons(_: web.Application) -> AsyncIterator[None]:
        forwarder.start(Addons((), metrics.addon_errors))
        yield
        await forwarder.close()

    app.cleanup_ctx.extend((upstream_session, no_addons))
    app.on_response_prepare.append(drop_invented_headers)
    app.on_shutdown.append(forwarder.streams.cut)
    app.router.add_route("*", "/{tail:(?s:.*)}", forwarder.forward)
    return app


async def serve(upstream: URL, port: int) -> None:
    """Serve on 127.0.0.1:`port` until SIGTERM or SIGINT, as the proxy's `serve` does."""
    runner = app_runner(relay_app(upstream))
    await runner.setup()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(signum, stop.set)
    try:
        await web.TCPSite(runner, "127.0.0.1", port).start()
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bare_relay", description=__doc__)
    parser.add_argument("--upstream", required=True, help="the upstream's URL, e.g. http://127.0.0.1:4096")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    keep_freed_bodies()
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(serve(URL(args.upstream), args.port))


if __name__ == "__main__":
    main()
