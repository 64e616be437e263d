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

from proxy.cli.serving import app_runner
from proxy.relay.departures import Departures
from proxy.relay.forward import Around, Forwarder
from proxy.relay.headers import drop_invented_headers
from proxy.relay.hooks import Addons
from proxy.relay.options import RelayOptions
from proxy.relay.stopping import OpenStreams
from proxy.relay.transport import Transport
from proxy.relay.upstream import upstream_session
from proxy.service.config import Settings
from proxy.service.metrics import Metrics
from proxy.system.heap import keep_freed_bodies


class _Relay:
    """The forwarder with no addons, built as the proxy's is: when the application starts."""

    forwarder: Forwarder

    def __init__(self, upstream: URL) -> None:
        defaults = Settings(upstream=upstream)
        self.options = RelayOptions(
            defaults.upstream_origin, defaults.connect_timeout, defaults.response_timeout, defaults.max_body
        )
        self.metrics = Metrics()
        self.streams = OpenStreams()

    async def run(self, _: web.Application) -> AsyncIterator[None]:
        options, metrics = self.options, self.metrics
        async with upstream_session(options.connect_timeout) as session:
            transport = Transport(options.upstream_origin, options.connect_timeout)
            around = Around(Departures(), self.streams, session)
            addons = Addons((), metrics.addon_errors)
            self.forwarder = Forwarder(options, metrics.relay, transport, addons, around)
            yield
            await transport.close()

    async def forward(self, request: web.Request) -> web.StreamResponse:
        return await self.forwarder.forward(request)


def relay_app(upstream: URL) -> web.Application:
    """The proxy's application (`service.app.create_app`) less its addons and its own routes."""
    relay = _Relay(upstream)
    app = web.Application()
    app.cleanup_ctx.append(relay.run)
    app.on_response_prepare.append(drop_invented_headers)
    app.on_shutdown.append(relay.streams.cut)
    app.router.add_route("*", "/{tail:(?s:.*)}", relay.forward)
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
