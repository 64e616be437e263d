"""`settle-proxy demo [--opencode PATH]`: see the fix work in a minute, with the opencode installed
here and nothing else.

It starts opencode on a free loopback port with data directories of its own and a scripted local
model (no account, no network), lets a `bash` call (2.x: `shell`) run `sleep`, SIGKILLs the server,
starts it again, and prints the call as the server serves it directly and as the proxy does, side
by side: in the message view and on an event stream open across the crash. Everything it started
is stopped when it ends, on Ctrl-C too.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
from collections.abc import Sequence
from enum import IntEnum
from typing import NoReturn

from proxy.cli.arguments import OneLineParser
from proxy.cli.options import Environ
from proxy.demo.client import Failed
from proxy.demo.lines import line_of
from proxy.demo.processes import version_of
from proxy.demo.report import report
from proxy.demo.scene import Installed, play
from proxy.supervision.server_command import unstartable

PROG = "settle-proxy demo"
INSTALL = (
    "install it with `npm i -g opencode-ai` (1.x) or `npm i -g @opencode/cli` (2.x), or give --opencode PATH"
)


class DemoExit(IntEnum):
    SHOWN = 0
    FAILED = 1
    """Something the demo waits for did not happen; the line says what."""
    BAD_USAGE = 2
    """No opencode to run (or one of no known line)."""
    INTERRUPTED = 130


def build_parser(environ: Environ = os.environ) -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=PROG,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        environ=environ,
    )
    parser.add_argument(
        "--opencode",
        metavar="PATH",
        help="the opencode program to run (1.x or 2.x); default: `opencode` on PATH",
    )
    return parser


def main(argv: Sequence[str]) -> None:
    """Entry point of `settle-proxy demo`."""
    args = build_parser().parse_args(argv)
    try:
        installed = _installed(args.opencode)
        outcome = asyncio.run(play(installed, _say))
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; everything it started is stopped", file=sys.stderr)
        sys.exit(DemoExit.INTERRUPTED)
    except Failed as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        sys.exit(DemoExit.FAILED)
    print(f"\n{report(outcome)}", flush=True)
    sys.exit(DemoExit.SHOWN)


def _installed(given: str | None) -> Installed:
    """The opencode to run, its version and its line; one line and exit 2 without one."""
    program = given if given is not None else shutil.which("opencode")
    if program is None:
        _refuse(f"opencode is not on PATH: {INSTALL}")
    if (why := unstartable(program)) is not None:
        _refuse(why)
    program = shutil.which(program) or program if os.sep not in program else os.path.abspath(program)
    printed = version_of(program) or ""
    if (found := line_of(printed)) is None:
        first = printed.splitlines()[0][:80] if printed else ""
        _refuse(f"{program} --version printed {first!r}: not an opencode 1.x or 2.x")
    return Installed(program, found[1], found[0])


def _say(step: str) -> None:
    print(step, flush=True)


def _refuse(why: str) -> NoReturn:
    print(f"{PROG}: error: {why}", file=sys.stderr)
    sys.exit(DemoExit.BAD_USAGE)
