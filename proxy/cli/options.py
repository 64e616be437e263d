"""The proxy's command-line options, shared by `settle-proxy` and `settle-proxy run`, and what
the other commands share with them.

With the parsers (`proxy.cli.arguments`, which apply every flag's `SETTLE_*` variable), this is
the one module that reads the environment: opencode's own credentials (`OPENCODE_PASSWORD`,
`OPENCODE_SERVER_*`) and the default locations (`XDG_*`); every other module is handed values,
and each reader takes the environment as a mapping (a test's, or `os.environ`).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from proxy.cli.arguments import UPSTREAM, OneLineParser, at_least_one, port, seconds, seconds_range, typed
from proxy.service.config import (
    DEFAULT_HOST,
    DEFAULT_MAX_BODY,
    DEFAULT_PORT,
    DEFAULT_UPSTREAM,
    DEFAULT_USERNAME,
    Settings,
    basic_authorization,
    parse_credentials,
)
from proxy.version import VERSION
from proxy.writeback.locations import default_path as opencode_database_path
from proxy.writeback.locations import locations
from proxy.writeback.modes import WriteBackMode

DESCRIPTION = """\
A reverse proxy for `opencode serve`. Everything is forwarded unchanged, except that in
message views (v1 /session/{id}/message..., v2 /api/session/{id}/message...) a tool part
still "running" in a session the server says is not active -- left behind by a crashed
server -- is shown settled, in the shape opencode writes for an interrupted tool.

Every flag can also be set by the environment variable named in its help (a switch by 1,
true, yes or on). For its own liveness look-ups the proxy uses the client's credentials, else
OPENCODE_PASSWORD or OPENCODE_SERVER_PASSWORD (user OPENCODE_SERVER_USERNAME, default
"opencode", on 1.x; always "opencode" on 2.x). It never answers a client with data the
upstream refused that client.

`settle-proxy settle --help` describes the offline command, which settles opencode.db
directly while no server runs on it; `settle-proxy run --help` the supervising form, which
starts the server itself: `settle-proxy run [options] -- opencode serve [server options]`;
`settle-proxy orphans --help` lists (or ends) the processes a dead server left running;
`settle-proxy demo --help` shows the fix in a minute, with the opencode installed here.
"""


MIB = 2**20
HOUR_S, DAY_S = 3600.0, 86400.0
"""The most a seconds flag takes: a wait the proxy makes, or one a request or a resume may span."""
Environ = Mapping[str, str]
"""The environment the command line reads (`os.environ` unless a test hands it another)."""


def opencode_password(environ: Environ = os.environ) -> str | None:
    """OPENCODE_PASSWORD, else the older OPENCODE_SERVER_PASSWORD (2.x's order, in its `env.ts`)."""
    return environ.get("OPENCODE_PASSWORD") or environ.get("OPENCODE_SERVER_PASSWORD") or None


def opencode_authorization(environ: Environ = os.environ, password: str | None = None) -> str | None:
    """`Authorization` for opencode: `password` or `opencode_password`, as OPENCODE_SERVER_USERNAME
    (1.x's; on 2.x, whose user is always `opencode`, look-ups send it as that: `Credentials.as_user`)."""
    password = password or opencode_password(environ)
    username = environ.get("OPENCODE_SERVER_USERNAME") or DEFAULT_USERNAME
    return basic_authorization(username, password) if password else None


def with_password(password: str, environ: Environ = os.environ) -> dict[str, str]:
    """The environment a supervised server is given: `environ`, with `password` under both names."""
    return {**environ, "OPENCODE_PASSWORD": password, "OPENCODE_SERVER_PASSWORD": password}


def state_path(environ: Environ = os.environ) -> Path:
    """Where `settle-proxy run` and a proxy record tool processes, and `orphans` reads them:
    `$XDG_STATE_HOME/settle-proxy/processes.db`."""
    state_home = environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state_home) / "settle-proxy" / "processes.db"


def add_database_option(parser: argparse.ArgumentParser, help: str, environ: Environ = os.environ) -> None:
    """`--db`, opencode's database: the proxy's for `--write-back db`, the offline command's to settle."""
    parser.add_argument("--db", type=Path, default=str(opencode_database_path(environ)), help=help)


def _mebibytes(text: str) -> int:
    mebibytes = float(text)
    if not 0 < mebibytes <= 2**20:  # NaN is refused too
        raise ValueError(text)
    return max(1, round(mebibytes * MIB))


class _Flags:
    """Adds the proxy's flags, each set by `variable` as well (the parser applies it)."""

    def __init__(self, parser: OneLineParser) -> None:
        self._parser = parser

    def add(
        self, flag: str, variable: str, default: str, help: str, *, shown: bool = True, **kwargs: Any
    ) -> None:
        """`flag`, defaulting to `$variable` or else `default`; `shown=False` keeps the default out of
        --help (where it says nothing useful)."""
        self._parser.add_argument(flag, variable=variable, shown=shown, default=default, help=help, **kwargs)

    def seconds(
        self, flag: str, variable: str, default: str, help: str, most: float, *, zero: bool = False
    ) -> None:
        """Seconds, finite, at most `most`, above 0 unless `zero` (whose meaning `help` must give)."""
        help = f"{help} ({seconds_range(most, zero=zero)})"
        self.add(flag, variable, default, help, shown=default != "0", type=seconds(most, zero=zero))


def build_parser(
    prog: str = "settle-proxy", description: str = DESCRIPTION, environ: Environ = os.environ
) -> OneLineParser:
    """The command-line interface; defaults come from `environ`."""
    parser = OneLineParser(
        prog=prog,
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        environ=environ,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {VERSION}")
    flags = _Flags(parser)
    _connection_flags(flags)
    _settling_flags(flags)
    _resume_flags(parser, flags)
    _stall_flags(parser, flags)
    add_database_option(
        parser,
        "opencode's database, for --write-back db; --write-back api reads a v2 session's log from it "
        "(read-only) when it holds the session",
        environ,
    )
    parser.add_argument(
        "--auth",
        metavar="USER:PASSWORD",
        type=typed(parse_credentials, "USER:PASSWORD", secret=True),
        default=None,
        secret=True,
        help="require this HTTP Basic login (or ?auth_token=) on every route of the proxy; what the client "
        "sends is forwarded as is, so use the server's own credentials to log in once for both",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="log and count what would be settled, but change no response and write nothing",
    )
    parser.add_argument(
        "--access-log",
        action="store_true",
        help="log one line per request: method, path (secret query values hidden), status, bytes, "
        "milliseconds, and the parts settled",
    )
    flags.add(
        "--log-format",
        "SETTLE_LOG_FORMAT",
        "text",
        "text for people, json (one object per line) for log pipelines",
        choices=("text", "json"),
    )
    flags.add(
        "--log-level",
        "SETTLE_LOG_LEVEL",
        "info",
        "how much to log",
        choices=("debug", "info", "warning", "error"),
    )
    return parser


def _connection_flags(flags: _Flags) -> None:
    """Where the proxy listens, what it proxies, and how long it waits on it."""
    flags.add(
        "--upstream", "SETTLE_UPSTREAM", DEFAULT_UPSTREAM, "the opencode server to proxy", type=UPSTREAM
    )
    flags.add(
        "--host", "SETTLE_HOST", DEFAULT_HOST, "address to listen on; anything but loopback is warned about"
    )
    flags.add(
        "--port",
        "SETTLE_PORT",
        str(DEFAULT_PORT),
        "port to listen on",
        type=typed(port, "a port number from 0 to 65535"),
    )
    flags.seconds(
        "--connect-timeout",
        "SETTLE_CONNECT_TIMEOUT",
        "10",
        "seconds to connect upstream before answering 502; once connected, a client's request has no "
        "deadline unless --response-timeout sets one",
        HOUR_S,
    )
    flags.seconds(
        "--response-timeout",
        "SETTLE_RESPONSE_TIMEOUT",
        "0",
        "seconds a plain request may wait on the upstream (headers, then each piece of the body) "
        "before a 504; 0 for no limit, the default: opencode 1.x's POST /session/{id}/message answers "
        "only when the turn ends, which can take many minutes. Never applied to event streams or PTYs "
        "(/_settle/up and /_settle/health answer within 2.5 s)",
        DAY_S,
        zero=True,
    )
    flags.add(
        "--max-body",
        "SETTLE_MAX_BODY",
        str(DEFAULT_MAX_BODY // MIB),
        "MiB of a message view read whole to be checked, as sent and once decoded; a larger one, or "
        "a compressed one inflating past it, is relayed unchecked, as sent, with one log line",
        type=typed(_mebibytes, "a positive number of MiB"),
        metavar="MIB",
    )
    flags.seconds(
        "--liveness-timeout",
        "SETTLE_LIVENESS_TIMEOUT",
        "5",
        "seconds a liveness look-up may take before a body is passed on unchanged",
        HOUR_S,
    )


def _settling_flags(flags: _Flags) -> None:
    """Whether and when settlements are made durable."""
    flags.add(
        "--write-back",
        "SETTLE_WRITE_BACK",
        WriteBackMode.OFF.value,
        "make settlements durable: `api` through the server (every client is told; v1 parts and v2 "
        "tools), `db` straight into opencode.db (also closes v1 messages; for a server you cannot reach), "
        "`off` to only rewrite views. Only parts inactive in two readings --grace apart are written",
        choices=[mode.value for mode in WriteBackMode],
    )
    flags.seconds(
        "--grace",
        "SETTLE_GRACE",
        "2",
        "seconds between the two liveness readings before a write-back; 0 takes them back to back",
        HOUR_S,
        zero=True,
    )


def _resume_flags(parser: argparse.ArgumentParser, flags: _Flags) -> None:
    """Whether, how often and how late a turn a crash interrupted is started again."""
    parser.add_argument(
        "--resume",
        action="store_true",
        help="start again, at most once, a turn the proxy saw running when the server died, once its calls "
        "are settled durably (opencode 1.18: written back, so only with --write-back; 2.x: by the server's "
        "own drain), with a prompt naming them, when every call only read or waited (--resume-safe, "
        "--resume-unsafe); any other waits for a person (POST /_settle/resume/SESSION); never over a newer "
        "message, a pending permission, question or form, a child session, or a turn older than "
        "--resume-within",
    )
    flags.add(
        "--resume-attempts",
        "SETTLE_RESUME_ATTEMPTS",
        "3",
        "prompts sent at most for one interrupted turn, counting a resumed turn interrupted again and a "
        "prompt the server admitted but never ran",
        type=typed(at_least_one, "a whole number of at least 1"),
    )
    flags.seconds(
        "--resume-within",
        "SETTLE_RESUME_WITHIN",
        "300",
        "seconds after the server was last heard with the turn running past which it is not resumed "
        "(a restart by `run` takes seconds; a later one was a person's)",
        DAY_S,
    )
    flags.add(
        "--resume-text",
        "SETTLE_RESUME_TEXT",
        "",
        "the prompt a resumed turn starts with, instead of the one that names each interrupted call and "
        "says its outcome is unknown",
        shown=False,
    )
    _resume_safety_flags(parser, flags)


def _resume_safety_flags(parser: argparse.ArgumentParser, flags: _Flags) -> None:
    """Which interrupted calls `--resume` continues by itself, and how fast after one crash."""
    parser.add_argument(
        "--resume-safe",
        action="append",
        default=[],
        metavar="PATTERN",
        help="also continue by itself a call whose tool name, command line or one of its simple "
        "commands matches this glob (repeatable; the variable takes several, comma-separated)",
    )
    parser.add_argument(
        "--resume-unsafe",
        action="store_true",
        help="also continue by itself a turn whose interrupted call may have changed something "
        "(an edit, a build, `git push`); without it such a turn waits for a person",
    )
    flags.add(
        "--resume-concurrency",
        "SETTLE_RESUME_CONCURRENCY",
        "2",
        "continuations admitted at once after one crash",
        type=typed(at_least_one, "a whole number of at least 1"),
    )
    flags.seconds(
        "--resume-spacing",
        "SETTLE_RESUME_SPACING",
        "2",
        "seconds at least between two admitted continuations; 0 admits them back to back",
        HOUR_S,
        zero=True,
    )


def _stall_flags(parser: argparse.ArgumentParser, flags: _Flags) -> None:
    """When a call with nothing of its own left running is named stalled, and whether it is ended."""
    flags.seconds(
        "--stall-after",
        "SETTLE_STALL_AFTER",
        "10",
        "seconds a running call's own process must have exited, while a process it started still "
        "holds its output open, before the call is named stalled (/_settle/health, one log line, "
        "a metric); a call whose own process lives, or that waits for a person, never is",
        DAY_S,
    )
    parser.add_argument(
        "--stall-abort",
        action="store_true",
        help="end a stalled call through the server's own abort (1.x POST /session/ID/abort, 2.x "
        "POST /api/session/ID/interrupt), once per call, with one log line; a turn ended so is never "
        "resumed",
    )


def settings_from(args: argparse.Namespace, environ: Environ = os.environ) -> Settings:
    """Settings from parsed flags and, from `environ`, opencode's credentials, where the write
    locks live and where tool processes are recorded."""
    where = locations(Path(args.db), environ=environ)
    return Settings(
        upstream=args.upstream,
        host=args.host,
        port=args.port,
        authorization=opencode_authorization(environ),
        connect_timeout=args.connect_timeout,
        liveness_timeout=args.liveness_timeout,
        max_body=args.max_body,
        response_timeout=args.response_timeout or None,
        write_back=WriteBackMode(args.write_back),
        grace=args.grace,
        db_path=where.db_path,
        dry_run=args.dry_run,
        lock_dir=where.lock_dir,
        state_db=state_path(environ),
        auth=args.auth,
        resume=bool(args.resume),
        resume_attempts=args.resume_attempts,
        resume_within=args.resume_within,
        resume_text=args.resume_text or None,
        access_log=args.access_log,
        resume_safe=tuple(pattern for pattern in args.resume_safe if pattern),
        resume_unsafe=bool(args.resume_unsafe),
        resume_concurrency=args.resume_concurrency,
        resume_spacing=args.resume_spacing,
        stall_after=args.stall_after,
        stall_abort=bool(args.stall_abort),
    )
