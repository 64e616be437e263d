"""`settle-proxy` / `python -m proxy`: run the proxy in front of `opencode serve`."""

from __future__ import annotations

import argparse
import asyncio
import difflib
import errno
import logging
import os
import socket
import sys
from collections.abc import Callable, Sequence

from aiohttp import web

from proxy.cli import demo as demo_command
from proxy.cli import offline
from proxy.cli import orphans as orphans_command
from proxy.cli import run as run_command
from proxy.cli.options import build_parser, settings_from
from proxy.cli.stopping import Stopping
from proxy.opencode.other_processes import is_loopback
from proxy.service import logs
from proxy.service.access_log import ACCESS_LOG, AccessLog
from proxy.service.app import create_app
from proxy.service.config import Settings
from proxy.supervision.supervisor import Supervisor, supervised
from proxy.system.heap import give_back_every, keep_freed_bodies
from proxy.version import VERSION
from proxy.writeback.database import NotOpencodeDatabase

log = logging.getLogger("proxy")

COMMANDS = ("serve", "run", "settle", "orphans", "demo")
"""The words that select a command; `serve`, the proxy itself, is also what none selects."""
USAGE = """%(prog)s [serve] [options]
       %(prog)s run [options] -- opencode serve [server options]
       %(prog)s settle [options]
       %(prog)s orphans [options]
       %(prog)s demo [--opencode PATH]"""


def proxy_parser() -> argparse.ArgumentParser:
    """The proxy's parser, whose usage names every command."""
    parser = build_parser()
    parser.usage = USAGE
    return parser


PARSERS: dict[str, Callable[[], argparse.ArgumentParser]] = {
    "": proxy_parser,
    "run": run_command.build_run_parser,
    "settle": offline.build_parser,
    "orphans": orphans_command.build_parser,
    "demo": demo_command.build_parser,
}
"""The parser of each command, by the word that selects it (none for the proxy itself)."""


SHUTDOWN_TIMEOUT_S = 0.5
"""How long a stop waits for a request under way to end, and again once it is told to (aiohttp
waits twice): about a second in all. Event streams and WebSockets are cut first, at once."""
KEEPALIVE_TIMEOUT_S = 75.0
"""How long an idle connection is kept, as nginx's `keepalive_timeout`; aiohttp's timer also runs
while a request's head arrives, so a head must come whole within it (nginx's
`client_header_timeout` is 60 s). It never runs while a request is being answered: a long
synchronous prompt or an event stream is never cut by it."""


def app_runner(app: web.Application, *, access_log: bool = False) -> web.AppRunner:
    """The runner `serve` runs `app` with. Handlers are cancelled when their client goes away,
    which closes the matching upstream request (an abandoned event stream must not live on)."""
    return web.AppRunner(
        app,
        handler_cancellation=True,
        access_log=ACCESS_LOG if access_log else None,
        access_log_class=AccessLog,
        shutdown_timeout=SHUTDOWN_TIMEOUT_S,
        keepalive_timeout=KEEPALIVE_TIMEOUT_S,
    )


async def serve(settings: Settings, supervisor: Supervisor | None = None) -> int:
    """Serve until SIGTERM or SIGINT (or, under `run`, until the server is gone for good); return
    the exit code. A stop stops accepting, cuts the open streams, gives requests under way about a
    second, and only then stops a supervised server: its own clean end of a stream must not reach
    a client as the end of it."""
    app = create_app(settings, supervisor=supervisor)
    runner = app_runner(app, access_log=settings.access_log)
    await runner.setup()
    stopping = Stopping(supervisor)
    stopping.install(asyncio.get_running_loop())
    stop = stopping.requested
    giving_back = asyncio.create_task(give_back_every(), name="heap-give-back")
    try:
        try:
            await web.TCPSite(runner, settings.host, settings.port).start()
        except OSError as error:
            raise CannotListen.because(error) from None
        log.info(
            "settle-proxy %s on http://%s:%d -> %s",
            VERSION,
            settings.host,
            bound_port(runner, settings.port),
            settings.upstream_origin,
        )
        if supervisor is None:
            await stop.wait()
            return 0
        supervisor.address = f"http://{settings.host}:{settings.port}"
        return await supervised(supervisor, stop, runner.cleanup)
    finally:
        if runner.server is not None:  # not yet cleaned up by `supervised`
            await runner.cleanup()
        giving_back.cancel()
        stopping.said()


def bound_port(runner: web.AppRunner, asked: int) -> int:
    """The port the system gave for `--port 0` (any free one); else the one asked for."""
    ports = [address[1] for address in runner.addresses if isinstance(address, tuple)]
    return ports[0] if ports else asked


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop  # noqa: PLC0415 - optional speed-up
    except ImportError:
        return None
    return uvloop.new_event_loop


def _command_word(arguments: list[str]) -> list[str]:
    """`arguments` without a leading `serve`; an unknown command word is one line suggesting the
    nearest command, exit 2 (a flag's value never comes first, so a first word is a command)."""
    if arguments[:1] == ["serve"]:
        return arguments[1:]
    if arguments and not arguments[0].startswith("-") and arguments[0] not in COMMANDS:
        nearest = difflib.get_close_matches(arguments[0], COMMANDS, n=1)
        hint = f"; did you mean {nearest[0]!r}?" if nearest else ""
        proxy_parser().error(f"unknown command {arguments[0]!r}{hint} (commands: {', '.join(COMMANDS)})")
    return arguments


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the console script and of `python -m proxy`; `settle` runs the offline command."""
    arguments = _command_word(sys.argv[1:] if argv is None else list(argv))
    if arguments[:1] == ["settle"]:
        offline.main(arguments[1:])
        return
    if arguments[:1] == ["orphans"]:
        orphans_command.main(arguments[1:])
        return
    if arguments[:1] == ["demo"]:
        demo_command.main(arguments[1:])
        return
    if arguments[:1] == ["run"]:
        args, settings, supervisor = run_command.parse(arguments[1:])
        run_command.refuse_an_unstartable_server(supervisor)
    else:
        args = proxy_parser().parse_args(arguments)
        settings, supervisor = settings_from(args), None
    logs.configure(args.log_level, args.log_format)
    keep_freed_bodies()
    if not is_loopback(settings.host):
        log.warning("listening on %s: clients beyond this machine can reach the proxy", settings.host)
    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            code = runner.run(serve(settings, supervisor))
    except (FileNotFoundError, NotOpencodeDatabase) as error:
        print(f"settle-proxy: error: {error}", file=sys.stderr)
        code = 2
    except CannotListen as error:
        sys.exit(f"settle-proxy: error: cannot listen on {settings.host}:{settings.port}: {error}")
    sys.exit(code)


class CannotListen(Exception):
    """The address cannot be listened on; the text says why, and what to do."""

    @classmethod
    def because(cls, error: OSError) -> CannotListen:
        # aiohttp's text repeats the address; the errno's own words say it once.
        why = os.strerror(error.errno) if error.errno and error.errno > 0 else error.strerror or str(error)
        if error.errno == errno.EADDRINUSE:
            why += " (another process listens there: choose another --port, or 0 for any free one)"
        elif isinstance(error, socket.gaierror):
            why += " (--host is an address or a name this machine resolves, such as 127.0.0.1)"
        return cls(why)
