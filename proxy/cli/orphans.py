"""`settle-proxy orphans [--terminate]`: the processes dead servers left running, from the state
database `settle-proxy run` keeps, for when no proxy is there to ask (it was stopped, or killed
with its server).

A recorded process counts only while the very same process (pid and start time) still runs and
the server that started it (pid and start time) does not. `--terminate` ends the process groups of
the calls that were running when their server died; a process of a completed call is listed, never
ended.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sqlite3
import sys
from collections.abc import Sequence
from enum import IntEnum
from pathlib import Path
from typing import NoReturn

from rich.console import Console
from rich.table import Table

from proxy.cli.arguments import OneLineParser
from proxy.cli.options import Environ, state_path
from proxy.supervision.process_records import ProcessRecords, Recorded
from proxy.system.reaper import end_groups

GRACE_S = 10.0


class OrphansExit(IntEnum):
    NONE = 0
    FOUND = 10
    """Orphaned processes were found (and, with --terminate, the running calls' ones ended)."""
    BAD_USAGE = 2
    INTERRUPTED = 130


def build_parser(environ: Environ = os.environ) -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="settle-proxy orphans",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        environ=environ,
    )
    parser.add_argument(
        "--state",
        type=Path,
        default=str(state_path(environ)),
        help="the state database settle-proxy run keeps",
    )
    parser.add_argument(
        "--terminate",
        action="store_true",
        help="end the process groups of calls that were running at the crash "
        f"(SIGTERM, then SIGKILL after {GRACE_S:g} s)",
    )
    return parser


def _records_in(path: Path) -> bool:
    """Whether `path` holds tool processes' records, read only: a `--state` naming some other
    file gets no table of ours, and one that is not SQLite one line (exit 2), not a traceback."""
    try:
        with contextlib.closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as db:
            tables = db.execute("SELECT 1 FROM sqlite_master WHERE name = 'tool_process'").fetchall()
    except sqlite3.Error as error:
        _refuse(f"not a state database: {path}: {error}")
    return bool(tables)


def _refuse(why: str) -> NoReturn:
    print(f"settle-proxy orphans: error: {why}", file=sys.stderr)
    sys.exit(OrphansExit.BAD_USAGE)


async def orphans(path: Path) -> list[Recorded]:
    async with ProcessRecords.open(path) as records:
        return await records.left_running()


def show(found: list[Recorded], console: Console) -> None:
    table = Table(title="processes left running by a dead opencode server")
    for column in ("pid", "command", "session", "part", "tool", "call at the crash"):
        table.add_column(column, overflow="fold")
    for recorded in found:
        call = recorded.call
        state = "running" if call.running else "completed"
        table.add_row(
            str(recorded.process.pid), recorded.command, call.session_id, call.call, call.tool, state
        )
    console.print(table)


def main(argv: Sequence[str]) -> None:
    """Entry point of `settle-proxy orphans`."""
    args = build_parser().parse_args(argv)
    console = Console() if sys.stdout.isatty() else Console(width=200)
    if args.state.is_dir():
        _refuse(f"not a state database: {args.state}: it is a directory")
    if not args.state.is_file() or not _records_in(args.state):
        console.print(f"nothing recorded at {args.state}")
        sys.exit(OrphansExit.NONE)
    found = asyncio.run(orphans(args.state))
    if not found:
        console.print("no orphaned tool processes")
        sys.exit(OrphansExit.NONE)
    show(found, console)
    if args.terminate:
        terminate([recorded.process.pid for recorded in found if recorded.call.running], console)
    sys.exit(OrphansExit.FOUND)


def terminate(doomed: list[int], console: Console) -> None:
    """End the process groups of `doomed`, saying so first (it may take `GRACE_S`); Ctrl-C meanwhile
    is one line, not a traceback: what had SIGTERM keeps it, nothing gets SIGKILL."""
    try:
        console.print(f"ending the process groups of {len(doomed)} running call(s): SIGTERM, then SIGKILL")
        console.file.flush()
        end_groups(doomed, GRACE_S)
    except KeyboardInterrupt:
        print(
            "settle-proxy orphans: interrupted: the groups were sent SIGTERM, none SIGKILL; "
            "run it again to see what still runs",
            file=sys.stderr,
        )
        sys.exit(OrphansExit.INTERRUPTED)
    console.print(f"ended the process groups of {len(doomed)} call(s) that were running")
