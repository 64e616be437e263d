"""The proxy's command-line options, shared by `settle-proxy` and `settle-proxy run`.

Defaults come from the environment (`SETTLE_*`), and opencode's own credentials from
`OPENCODE_SERVER_PASSWORD` / `OPENCODE_SERVER_USERNAME`; they are read here and nowhere else.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from proxy import __version__
from proxy.cli.arguments import UPSTREAM, OneLineParser, typed
from proxy.service.auth import parse_credentials
from proxy.service.config import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    DEFAULT_UPSTREAM,
    DEFAULT_USERNAME,
    Settings,
    WriteBackMode,
    basic_authorization,
)
from proxy.supervision import process_records
from proxy.writeback.database import default_path

DESCRIPTION = """\
A reverse proxy for `opencode serve`. Everything is forwarded unchanged, except that in
message views (v1 /session/{id}/message..., v2 /api/session/{id}/message...) a tool part
still "running" in a session the server says is not active -- left behind by a crashed
server -- is shown settled, in the shape opencode writes for an interrupted tool.

Every flag can also be set by the environment variable named in its help. For its own
liveness look-ups the proxy uses the client's credentials; when a client sends none it uses
OPENCODE_SERVER_PASSWORD (user OPENCODE_SERVER_USERNAME, default "opencode"). It never
answers a client with data the upstream refused that client.

`settle-proxy settle --help` describes the offline command, which settles opencode.db
directly while no server runs on it; `settle-proxy run --help` the supervising form, which
starts the server itself: `settle-proxy run [options] -- opencode serve [server options]`;
`settle-proxy orphans --help` lists (or ends) the processes a dead server left running.
"""


def _env(name: str, default: str) -> str:
    return os.environ.get(name, default)


def _port(text: str) -> int:
    port = int(text)
    if not 0 <= port <= 65535:
        raise ValueError(text)
    return port


def build_parser(prog: str = "settle-proxy", description: str = DESCRIPTION) -> argparse.ArgumentParser:
    """The command-line interface; defaults come from the environment."""
    parser = OneLineParser(
        prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "--upstream",
        type=UPSTREAM,
        default=_env("SETTLE_UPSTREAM", DEFAULT_UPSTREAM),
        help="the opencode server to proxy [SETTLE_UPSTREAM, default %(default)s]",
    )
    parser.add_argument(
        "--host",
        default=_env("SETTLE_HOST", DEFAULT_HOST),
        help="address to listen on; anything but loopback is warned about [SETTLE_HOST, default %(default)s]",
    )
    parser.add_argument(
        "--port",
        type=typed(_port, "a port number from 0 to 65535"),
        default=_env("SETTLE_PORT", str(DEFAULT_PORT)),
        help="port to listen on [SETTLE_PORT, default %(default)s]",
    )
    parser.add_argument(
        "--connect-timeout",
        type=typed(float, "a number of seconds"),
        default=_env("SETTLE_CONNECT_TIMEOUT", "10"),
        help="seconds to connect upstream before answering 502 [SETTLE_CONNECT_TIMEOUT, default %(default)s]",
    )
    parser.add_argument(
        "--response-timeout",
        type=typed(float, "a number of seconds"),
        default=_env("SETTLE_RESPONSE_TIMEOUT", "0"),
        help="seconds a plain request may wait on the upstream (headers, then each piece of the body) "
        "before a 504; 0 for no limit, the default, as opencode's synchronous prompt answers only when "
        "the turn ends. Never applied to event streams or PTYs [SETTLE_RESPONSE_TIMEOUT]",
    )
    parser.add_argument(
        "--liveness-timeout",
        type=typed(float, "a number of seconds"),
        default=_env("SETTLE_LIVENESS_TIMEOUT", "5"),
        help="seconds a liveness look-up may take before a body is passed on unchanged "
        "[SETTLE_LIVENESS_TIMEOUT, default %(default)s]",
    )
    parser.add_argument(
        "--write-back",
        choices=[mode.value for mode in WriteBackMode],
        default=_env("SETTLE_WRITE_BACK", WriteBackMode.OFF.value),
        help="make settlements durable: `api` through the server (every client is told; v1 parts and v2 "
        "tools), `db` straight into opencode.db (also closes v1 messages; for a server you cannot reach), "
        "`off` to only rewrite views. Only parts inactive in two readings --grace apart are written "
        "[SETTLE_WRITE_BACK, default %(default)s]",
    )
    parser.add_argument(
        "--grace",
        type=typed(float, "a number of seconds"),
        default=_env("SETTLE_GRACE", "2"),
        help="seconds between the two liveness readings before a write-back "
        "[SETTLE_GRACE, default %(default)s]",
    )
    parser.add_argument(
        "--db",
        type=Path,
        default=_env("SETTLE_DB", str(default_path())),
        help="opencode's database, for --write-back db [SETTLE_DB, default %(default)s]",
    )
    parser.add_argument(
        "--auth",
        metavar="USER:PASSWORD",
        type=typed(parse_credentials, "USER:PASSWORD", secret=True),
        default=None,
        help="require this HTTP Basic login (or ?auth_token=) on every route of the proxy; what the client "
        "sends is forwarded as is, so use the server's own credentials to log in once for both [SETTLE_AUTH]",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        default=_env("SETTLE_DRY_RUN", "") not in ("", "0", "false"),
        help="log and count what would be settled, but change no response and write nothing [SETTLE_DRY_RUN]",
    )
    parser.add_argument(
        "--log-format",
        choices=("text", "json"),
        default=_env("SETTLE_LOG_FORMAT", "text"),
        help="text for people, json (one object per line) for log pipelines "
        "[SETTLE_LOG_FORMAT, default %(default)s]",
    )
    parser.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        default=_env("SETTLE_LOG_LEVEL", "info"),
        help="how much to log [SETTLE_LOG_LEVEL, default %(default)s]",
    )
    return parser


def settings_from(args: argparse.Namespace) -> Settings:
    """Settings from parsed flags and the opencode credentials in the environment."""
    password = os.environ.get("OPENCODE_SERVER_PASSWORD")
    username = os.environ.get("OPENCODE_SERVER_USERNAME") or DEFAULT_USERNAME
    return Settings(
        upstream=args.upstream,
        host=args.host,
        port=args.port,
        authorization=basic_authorization(username, password) if password else None,
        connect_timeout=args.connect_timeout,
        liveness_timeout=args.liveness_timeout,
        response_timeout=args.response_timeout or None,
        write_back=WriteBackMode(args.write_back),
        grace=args.grace,
        db_path=Path(args.db),
        dry_run=args.dry_run,
        state_db=process_records.default_path(),
        auth=args.auth or _auth_from_environment(),
    )


def _auth_from_environment() -> tuple[str, str] | None:
    """SETTLE_AUTH is read here, not as a flag default, so that --help never prints it."""
    text = os.environ.get("SETTLE_AUTH")
    if not text:
        return None
    try:
        return parse_credentials(text)
    except ValueError:
        sys.exit("settle-proxy: error: SETTLE_AUTH: expected USER:PASSWORD")
