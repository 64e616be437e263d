"""`settle-proxy settle`: settle orphaned tool parts in `opencode.db` while no server uses it.

For users whose server is down or private (`opencode --standalone`, the stdio server), and
for anyone who wants the fix made permanent before clients connect again. It refuses rather
than guesses: with `--upstream` it asks that server which sessions are live and leaves
those alone; without it, a process that has the database open means a server may be
running on it, and nothing is written. With `--upstream`, another process holding the
database (a second server, a TUI) may run tools that server cannot see: whatever was alive
after the earliest such process started is left alone.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import IntEnum
from pathlib import Path

import aiohttp
from rich.console import Console
from rich.progress import Progress
from rich.table import Table
from yarl import URL

from proxy.arguments import UPSTREAM, OneLineParser
from proxy.config import DEFAULT_USERNAME, Settings, basic_authorization
from proxy.database import OpencodeDatabase, OpenTool, default_path
from proxy.holders import can_see_holders, holders
from proxy.liveness import LivenessProbe, LivenessUnknown
from proxy.processes import mark_this_process, survey
from proxy.upstream_api import Credentials, UpstreamApi
from rules import Api, Liveness


class Exit(IntEnum):
    """What the exit code tells a script."""

    NOTHING_TO_DO = 0
    SETTLED = 10
    """Parts were settled (or, with --dry-run, would be)."""
    REFUSED = 3
    """A server may be using the database, or could not say which sessions are live."""
    BAD_USAGE = 2


_EPILOG = f"""\
exit codes: {Exit.NOTHING_TO_DO} nothing to do, {Exit.SETTLED} settled (or would settle) at least one part,
{Exit.REFUSED} refused (a server may be running on the database), {Exit.BAD_USAGE} bad usage.
"""


class Refused(RuntimeError):
    """Settling now could write over live work."""


@dataclass(frozen=True, slots=True)
class Plan:
    """What a run found: the open tools it will settle and the live sessions it leaves alone."""

    settle: list[OpenTool]
    live: list[OpenTool]
    elsewhere: list[OpenTool] = field(default_factory=list)
    """Open tools that started after another process on the database did: they may run there."""
    elsewhere_since: int | None = None
    """`Liveness.elsewhere_since` of every settlement; the rules hold back what was alive later."""
    unknown: str | None = None
    """Why other processes on the database could not be surveyed, when they could not."""


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="settle-proxy settle",
        description=__doc__,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--db",
        type=Path,
        default=Path(os.environ.get("SETTLE_DB", default_path())),
        help="opencode's database [SETTLE_DB, default %(default)s]",
    )
    parser.add_argument("--dry-run", action="store_true", help="print what would be settled; write nothing")
    parser.add_argument(
        "--upstream",
        type=UPSTREAM,
        default=None,
        help="a server running on this database, asked which sessions are live "
        "(credentials from OPENCODE_SERVER_PASSWORD / OPENCODE_SERVER_USERNAME)",
    )
    return parser


async def plan(database: OpencodeDatabase, db_path: Path, upstream: URL | None) -> Plan:
    """Find the open tools and decide, without guessing, which of them may be settled."""
    tools = await database.open_tools()
    if not tools:
        return Plan([], [])
    if upstream is None:
        _refuse_if_in_use(db_path)
        return Plan(tools, [])
    active = await _active_sessions(upstream, {(tool.api, tool.session_id) for tool in tools})
    # The upstream's process, when it can be identified, is the one whose liveness was asked;
    # every other holder of the file (unidentified: every holder) bounds what may be settled.
    around = await asyncio.to_thread(survey, upstream, database=db_path)
    bound = around.bound
    live = [tool for tool in tools if (tool.api, tool.session_id) in active]
    elsewhere = [tool for tool in tools if tool not in live and bound is not None and tool.since >= bound]
    settle = [tool for tool in tools if tool not in live and tool not in elsewhere]
    return Plan(settle, live, elsewhere, bound, around.unknown)


def _refuse_if_in_use(db_path: Path) -> None:
    if not can_see_holders():
        raise Refused("cannot tell whether a server uses the database here (no /proc); pass --upstream")
    users = holders(db_path)
    if users:
        found = "; ".join(f"pid {user.pid}: {user.command[:80]}" for user in users)
        raise Refused(
            f"{db_path} is open in another process ({found}), so a server may be running on it. "
            "Stop it, or pass --upstream URL to let it say which sessions are live."
        )


async def _active_sessions(upstream: URL, sessions: set[tuple[Api, str]]) -> set[tuple[Api, str]]:
    password = os.environ.get("OPENCODE_SERVER_PASSWORD")
    username = os.environ.get("OPENCODE_SERVER_USERNAME") or DEFAULT_USERNAME
    settings = Settings(
        upstream=upstream, authorization=basic_authorization(username, password) if password else None
    )
    credentials = Credentials.configured(settings.authorization)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        probe = LivenessProbe(UpstreamApi(session, settings), settings)
        try:
            readings = [
                await probe.read(api, session_id, credentials) for api, session_id in sorted(sessions)
            ]
        except LivenessUnknown as error:
            raise Refused(f"{upstream} could not say which sessions are live: {error}") from error
    return {
        (api, reading.session_id)
        for (api, _), reading in zip(sorted(sessions), readings, strict=True)
        if reading.active
    }


def show(plan_: Plan, console: Console) -> None:
    """The dry-run table: what would change, and what is left alone because it is live."""
    table = Table(title="open tool calls in opencode.db")
    for column in ("session", "api", "directory", "message", "tool", "open since", "action"):
        table.add_column(column, overflow="fold")
    rows = [
        *((t, "settle") for t in plan_.settle),
        *((t, "live: leave") for t in plan_.live),
        *((t, "another process may run it: leave") for t in plan_.elsewhere),
    ]
    for tool, action in rows:
        since = datetime.fromtimestamp(tool.since / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        table.add_row(tool.session_id, tool.api, tool.directory, tool.message_id, tool.tool, since, action)
    console.print(table)


async def settle_all(
    database: OpencodeDatabase,
    tools: Sequence[OpenTool],
    console: Console,
    elsewhere_since: int | None = None,
) -> int:
    """Settle every session of `tools`, one transaction each; returns the number of rows written."""
    sessions = sorted({(tool.api, tool.session_id) for tool in tools})
    written = 0
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("settling", total=len(sessions))
        for api, session_id in sessions:
            liveness = Liveness(session_id, active=False, elsewhere_since=elsewhere_since)
            written += len(await database.settle_session(api, session_id, liveness))
            progress.advance(task)
    return written


async def run(args: argparse.Namespace, console: Console) -> Exit:
    mark_this_process()
    async with OpencodeDatabase.open(args.db) as database:
        found = await plan(database, args.db, args.upstream)
        if found.unknown is not None:
            print(
                f"settle-proxy settle: warning: other processes on the database unknown: {found.unknown}",
                file=sys.stderr,
            )
        if found.elsewhere:
            console.print(f"{len(found.elsewhere)} tool call(s) left alone: another process may run them")
        if not found.settle:
            console.print(f"nothing to do: no orphaned tool calls ({len(found.live)} live left alone)")
            return Exit.NOTHING_TO_DO
        if args.dry_run:
            show(found, console)
            console.print(f"would settle {len(found.settle)} tool call(s); nothing written (--dry-run)")
            return Exit.SETTLED
        rows = await settle_all(database, found.settle, console, found.elsewhere_since)
        console.print(
            f"settled {len(found.settle)} tool call(s) in {len({t.session_id for t in found.settle})} "
            f"session(s), {rows} row(s) written"
        )
        return Exit.SETTLED


def main(argv: Sequence[str]) -> None:
    """Entry point of `settle-proxy settle`."""
    args = build_parser().parse_args(argv)
    # Piped into a file or another program, rows keep whole ids rather than folding them.
    console = Console() if sys.stdout.isatty() else Console(width=200)
    try:
        code = asyncio.run(run(args, console))
    except Refused as refusal:
        print(f"settle-proxy settle: refused: {refusal}", file=sys.stderr)
        code = Exit.REFUSED
    except FileNotFoundError as error:
        print(f"settle-proxy settle: error: {error}", file=sys.stderr)
        code = Exit.BAD_USAGE
    sys.exit(code)
