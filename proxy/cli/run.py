"""`settle-proxy run [options] -- SERVER COMMAND`: the command line of the supervising form.

The server command's `--port`/`--hostname` are the address its clients use, so the proxy listens
there and the server is moved to a free loopback port; without them, the proxy's own `--port` and
`--host` apply as usual.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import replace

from yarl import URL

from proxy.cli.arguments import OneLineParser
from proxy.cli.options import (
    DESCRIPTION,
    Environ,
    build_parser,
    opencode_authorization,
    opencode_password,
    settings_from,
    state_path,
    with_password,
)
from proxy.service.config import Settings
from proxy.supervision.server_command import LOOPBACK, ServerCommand, free_loopback_port, unstartable
from proxy.supervision.server_password import stable_password, wants_a_password
from proxy.supervision.supervisor import Orphans, Restart, Supervisor

USAGE = "settle-proxy run [options] -- opencode serve [server options]"


def build_run_parser(environ: Environ = os.environ) -> OneLineParser:
    parser = build_parser(
        "settle-proxy run",
        "Start the server command given after `--` and proxy it: the proxy listens where the "
        "command asked to (its --port/--hostname; the proxy's own --port/--host only where it asks "
        "nowhere, and refused where it does), restarts it after a crash, and never lets it "
        "outlive the proxy.\n\n" + DESCRIPTION,
        environ,
    )
    parser.usage = USAGE
    parser.allow_abbrev = False  # `--po 1` would slip past the check of an explicit --port
    _without_upstream(parser)
    parser.add_argument(
        "--restart",
        choices=[policy.value for policy in Restart],
        default=Restart.ON_FAILURE.value,
        help="when to start the server again after it exits (default %(default)s): a server that "
        "answered for 10 s restarts after 0.5 s, exits in a row of one that did not back off, one that "
        "never answered is a failed start and not restarted, and more than 5 restarts within 60 s "
        "make the proxy give up and exit 1",
    )
    parser.add_argument(
        "--orphans",
        choices=[policy.value for policy in Orphans],
        default=Orphans.REPORT.value,
        help="what to do with the processes a crashed server leaves running: `report` them (log, "
        "/_settle/orphans), or also `terminate` those of calls that were running at the crash (SIGTERM, "
        "then SIGKILL); a process of a completed call, or of no known call, is only reported "
        "(default %(default)s)",
    )
    return parser


def _without_upstream(parser: OneLineParser) -> None:
    """`run` starts its own upstream: its parser has no --upstream to offer (`parse` refuses one
    by name), and the settings get the default that `run` then replaces."""
    for action in [action for action in parser._actions if "--upstream" in action.option_strings]:
        parser._remove_action(action)
        for group in parser._action_groups:
            if action in group._group_actions:
                group._group_actions.remove(action)
        for option in action.option_strings:
            parser._option_string_actions.pop(option, None)
        default = action.default
        parser.set_defaults(**{action.dest: action.type(default) if callable(action.type) else default})


def parse(arguments: Sequence[str]) -> tuple[argparse.Namespace, Settings, Supervisor]:
    """Options, settings and supervisor for `settle-proxy run ARGUMENTS`; exits 2 with one line if
    they are wrong."""
    parser = build_run_parser()
    if "--" not in arguments:
        if {"-h", "--help"} & set(arguments):
            parser.parse_args(["--help"])
        parser.error(f"the server command goes after `--`: {USAGE}")
    split = list(arguments).index("--")
    own, server = list(arguments[:split]), list(arguments[split + 1 :])
    if any(word == "--upstream" or word.startswith("--upstream=") for word in own):
        parser.error("--upstream is not for `run`: the proxy starts its own upstream")
    args = parser.parse_args(own)
    try:
        command = ServerCommand.parse(server)
    except ValueError as error:
        parser.error(f"server command: {error}")
    _refuse_an_address_that_does_nothing(parser, own, command)
    if (why := command.not_serving()) is not None:
        print(f"settle-proxy run: warning: {why}", file=sys.stderr)
    server_port = free_loopback_port()
    settings = replace(
        settings_from(args),
        upstream=URL.build(scheme="http", host=LOOPBACK, port=server_port),
        host=command.hostname or args.host,
        port=command.port if command.port is not None else args.port,
    )
    password = _server_password(command, settings)
    if password is not None:
        settings = replace(settings, authorization=opencode_authorization(password=password))
    supervisor = Supervisor(
        command,
        server_port,
        Restart(args.restart),
        Orphans(args.orphans),
        records=settings.state_db,
        environment=None if password is None else with_password(password),
        shown_password=password,
    )
    return args, settings, supervisor


def _refuse_an_address_that_does_nothing(
    parser: OneLineParser, own: list[str], command: ServerCommand
) -> None:
    """The server command's --port/--hostname say where the proxy listens: a --port/--host (or
    its variable) given as well would do nothing, and is refused rather than ignored."""
    for flag, dest, theirs, value in (
        ("--port", "port", "--port", command.port),
        ("--host", "host", "--hostname", command.hostname),
    ):
        on_command_line = any(word == flag or word.startswith(f"{flag}=") for word in own)
        given = flag if on_command_line else parser.set_by_variable(dest)
        if value is not None and given is not None:
            parser.error(
                f"{given} does nothing under `run` when the server command has {theirs}: the proxy "
                f"listens on the server command's {theirs} {value} and moves the server to a free "
                "loopback port; give one of the two"
            )


def _server_password(command: ServerCommand, settings: Settings) -> str | None:
    """The password a server that always wants one (opencode 2.x) is given when none is set: the
    same at every start, so that a restart locks no client out; None for a 1.x server, which runs
    without one, and when a password is set (the server reads it itself)."""
    if opencode_password() is not None or not wants_a_password(command.argv[0]):
        return None
    return stable_password((settings.state_db or state_path()).parent / "server-password")


def refuse_an_unstartable_server(supervisor: Supervisor) -> None:
    """Exit 2 with one line when the server's program cannot be started (not found, not
    executable), before the proxy starts anything: no restart repeats that."""
    if (why := unstartable(supervisor.program)) is not None:
        print(f"settle-proxy run: error: cannot start the server: {why}", file=sys.stderr)
        sys.exit(2)
