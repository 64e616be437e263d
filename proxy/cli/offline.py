"""`settle-proxy settle`: settle orphaned tool parts in `opencode.db` while no server uses it.

For users whose server is down or private (`opencode --standalone`, the stdio server), and
for anyone who wants the fix made permanent before clients connect again. It refuses rather
than guesses: with `--upstream` it asks that server which sessions are live and leaves
those alone; without it, a process that has the database open means a server may be
running on it, and nothing is written. With `--upstream`, another process holding the
database (a second server, a TUI) may run tools that server cannot see: whatever was alive
after the earliest such process started is left alone. Each session is settled on its own:
its rows re-read, then its reading taken, then a transaction that writes only if nothing
changed meanwhile, so a turn that starts during the run is seen.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import IntEnum
from pathlib import Path

import aiohttp
from rich.console import Console
from rich.progress import Progress
from rich.table import Table
from yarl import URL

from proxy.cli.arguments import UPSTREAM, OneLineParser
from proxy.cli.options import Environ, add_database_option, opencode_authorization
from proxy.opencode.client import Credentials, UpstreamApi
from proxy.opencode.liveness import LivenessProbe, LivenessUnknown
from proxy.opencode.other_processes import mark_this_process
from proxy.opencode.surveys import OtherProcesses
from proxy.system.holders import can_see_holders, holders
from proxy.writeback.database import TABLES, NotOpencodeDatabase, OpencodeDatabase
from proxy.writeback.scheduler import Confirm, Written
from rules import Api, Liveness, OpenTool


class SettleExit(IntEnum):
    """What the exit code tells a script."""

    NOTHING_TO_DO = 0
    SETTLED = 10
    """Parts were settled (or, with --dry-run, would be)."""
    REFUSED = 3
    """A server may be using the database, or could not say which sessions are live."""
    BAD_USAGE = 2
    INTERRUPTED = 130
    """Ctrl-C (SIGINT), as a shell reports it (128 + 2)."""


_EPILOG = (
    f"exit codes: {SettleExit.NOTHING_TO_DO} nothing to do, {SettleExit.SETTLED} settled (or would settle) at"
    " least one part,\n"
    f"{SettleExit.REFUSED} refused (a server may be running on the database),"
    f" {SettleExit.BAD_USAGE} bad usage,\n"
    f"{SettleExit.INTERRUPTED} interrupted (Ctrl-C).\n"
)


class Refused(RuntimeError):
    """Settling now could write over live work."""


@dataclass(frozen=True, slots=True)
class Triage:
    """What a run found: the open tools it will settle and the live sessions it leaves alone."""

    settle: list[OpenTool]
    live: list[OpenTool]
    elsewhere: list[OpenTool] = field(default_factory=list)
    """Open tools that started after another process on the database did: they may run there."""


def build_parser(environ: Environ = os.environ) -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="settle-proxy settle",
        description=__doc__,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        environ=environ,
    )
    add_database_option(parser, "opencode's database", environ)
    parser.add_argument("--dry-run", action="store_true", help="print what would be settled; write nothing")
    parser.add_argument(
        "--upstream",
        type=UPSTREAM,
        default=None,
        help="a server running on this database, asked which sessions are live "
        "(credentials from OPENCODE_SERVER_PASSWORD / OPENCODE_SERVER_USERNAME)",
    )
    return parser


Read = Callable[[Api, str], Awaitable[Liveness]]
"""A liveness reading for one session, or `Refused` when the server cannot say."""


@asynccontextmanager
async def readings(
    db_path: Path, upstream: URL | None, others: OtherProcesses | None, authorization: str | None
) -> AsyncIterator[Read]:
    """Where readings come from: the server at `--upstream` (asked with `authorization`, bounded by
    the `others` on the database), or, when no process has the database open, the certainty that
    nothing runs on it."""
    if upstream is None:
        _refuse_if_in_use(db_path)

        async def nothing_runs(_: Api, session_id: str) -> Liveness:
            return Liveness(session_id, active=False)

        yield nothing_runs
        return
    credentials = Credentials.configured(authorization)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        probe = LivenessProbe(UpstreamApi(session, upstream), authorization=authorization, elsewhere=others)

        async def ask(api: Api, session_id: str) -> Liveness:
            try:
                return await probe.read(api, session_id, credentials)
            except LivenessUnknown as error:
                raise Refused(f"{upstream} could not say which sessions are live: {error}") from error

        yield ask


async def triage(tools: Sequence[OpenTool], read: Read) -> Triage:
    """Which open tools would be settled now, and which are in sessions that are live (--dry-run)."""
    sessions = sorted({(tool.api, tool.session_id) for tool in tools})
    active = {(api, session_id) for api, session_id in sessions if (await read(api, session_id)).active}
    return Triage(
        [tool for tool in tools if (tool.api, tool.session_id) not in active],
        [tool for tool in tools if (tool.api, tool.session_id) in active],
    )


async def _apart_from_other_processes(
    tools: list[OpenTool], others: OtherProcesses | None, console: Console
) -> tuple[list[OpenTool], list[OpenTool]]:
    """The open tools no other process on the database can be running, and those it may be.

    The upstream's process, when it can be identified, is the one whose liveness is asked; every
    other holder of the file (unidentified: every holder) bounds what may be settled. The rules
    hold back the same tools in each session's own reading; this says so up front.
    """
    if others is None:
        return tools, []
    around = await others.current()
    if around.unknown is not None:
        print(
            f"settle-proxy settle: warning: other processes on the database unknown: {around.unknown}",
            file=sys.stderr,
        )
    bound = around.bound
    elsewhere = [tool for tool in tools if bound is not None and (tool.since or 0) >= bound]
    if elsewhere:
        console.print(f"{len(elsewhere)} tool call(s) left alone: another process may run them")
    return [tool for tool in tools if tool not in elsewhere], elsewhere


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


def show(found: Triage, console: Console) -> None:
    """The dry-run table: what would change, and what is left alone because it is live."""
    table = Table(title="open tool calls in opencode.db")
    for column in ("session", "api", "directory", "message", "tool", "open since", "action"):
        table.add_column(column, overflow="fold")
    rows = [
        *((t, "settle") for t in found.settle),
        *((t, "live: leave") for t in found.live),
        *((t, "another process may run it: leave") for t in found.elsewhere),
    ]
    for tool, action in rows:
        since = datetime.fromtimestamp((tool.since or 0) / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        table.add_row(tool.session_id, tool.api, tool.directory, tool.message_id, tool.tool, since, action)
    console.print(table)


@dataclass(frozen=True, slots=True)
class RunReport:
    """What a run wrote, and how many sessions it left alone because they were live."""

    written: list[Written]
    live: int


async def settle_all(
    database: OpencodeDatabase, tools: Sequence[OpenTool], read: Read, console: Console
) -> RunReport:
    """Settle session by session: its rows re-read, then its reading taken, then only the tools
    found open before (still open) written. A turn that starts while an earlier session is
    settled is seen in this session's own reading."""
    sessions = sorted({(tool.api, tool.session_id) for tool in tools})
    written: list[Written] = []
    live = 0
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("settling", total=len(sessions))
        for api, session_id in sessions:
            mine = [tool for tool in tools if (tool.api, tool.session_id) == (api, session_id)]
            targets = {tool.part for tool in mine} | {tool.message_id for tool in mine}
            taken: list[Liveness] = []
            confirm = _recording(read, api, session_id, taken)
            written += await database.settle_session(api, session_id, targets, confirm)
            live += any(liveness.active for liveness in taken)
            progress.advance(task)
    return RunReport(written, live)


def _recording(read: Read, api: Api, session_id: str, taken: list[Liveness]) -> Confirm:
    """The session's reading, kept in `taken` too so that the run can say it was live."""

    async def confirm() -> Liveness:
        taken.append(await read(api, session_id))
        return taken[-1]

    return confirm


async def run(args: argparse.Namespace, console: Console, authorization: str | None = None) -> SettleExit:
    """Settle (or with --dry-run, list) what `args` asks; an `--upstream` is asked with
    `authorization`."""
    mark_this_process()
    async with OpencodeDatabase.open(args.db, needs=TABLES) as database:
        tools = await database.open_tools()
        if not tools:
            console.print("nothing to do: no orphaned tool calls (0 live left alone)")
            return SettleExit.NOTHING_TO_DO
        others = OtherProcesses(args.upstream, database=args.db) if args.upstream is not None else None
        tools, elsewhere = await _apart_from_other_processes(tools, others, console)
        async with readings(args.db, args.upstream, others, authorization) as read:
            if args.dry_run:
                found = dataclasses.replace(await triage(tools, read), elsewhere=elsewhere)
                if not found.settle:
                    console.print(
                        f"nothing to do: no orphaned tool calls ({len(found.live)} live left alone)"
                    )
                    return SettleExit.NOTHING_TO_DO
                show(found, console)
                console.print(f"would settle {len(found.settle)} tool call(s); nothing written (--dry-run)")
                return SettleExit.SETTLED
            outcome = await settle_all(database, tools, read, console)
        calls = [item for item in outcome.written if item.part is not None]
        if not calls:
            console.print(f"nothing to do: no orphaned tool calls ({outcome.live} live left alone)")
            return SettleExit.NOTHING_TO_DO
        console.print(
            f"settled {len(calls)} tool call(s) in {len({item.session_id for item in calls})} "
            f"session(s), {len(outcome.written)} row(s) written"
        )
        return SettleExit.SETTLED


def main(argv: Sequence[str]) -> None:
    """Entry point of `settle-proxy settle`."""
    args = build_parser().parse_args(argv)
    # Piped into a file or another program, rows keep whole ids rather than folding them.
    console = Console() if sys.stdout.isatty() else Console(width=200)
    try:
        code = asyncio.run(run(args, console, opencode_authorization()))
    except Refused as refusal:
        print(f"settle-proxy settle: refused: {refusal}", file=sys.stderr)
        code = SettleExit.REFUSED
    except FileNotFoundError as error:
        print(f"settle-proxy settle: error: {error} (--db, or SETTLE_DB, names where it is)", file=sys.stderr)
        code = SettleExit.BAD_USAGE
    except NotOpencodeDatabase as error:
        print(f"settle-proxy settle: error: {error}", file=sys.stderr)
        code = SettleExit.BAD_USAGE
    except KeyboardInterrupt:
        # A session's transaction is all or nothing: one cut short was rolled back.
        print(
            "settle-proxy settle: interrupted: sessions settled stay so, the rest is as it was",
            file=sys.stderr,
        )
        code = SettleExit.INTERRUPTED
    sys.exit(code)
