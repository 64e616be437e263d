"""The command words and what each runs: `serve` (or none), `run`, `settle`, `orphans`, `demo`.

A command's modules are imported when it runs, and a parser's when it parses: `--help`,
`--version` and a usage error load no more than the parser they ask (`main` explains the
signals meanwhile).
"""

from __future__ import annotations

import argparse
import difflib
import signal
from collections.abc import Callable

from proxy.cli.options import build_parser, settings_from

# The imports inside functions below are each command's: loaded only when it runs (PLC0415).

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


def run_parser() -> argparse.ArgumentParser:
    from proxy.cli import run  # noqa: PLC0415

    return run.build_run_parser()


def settle_parser() -> argparse.ArgumentParser:
    from proxy.cli import offline  # noqa: PLC0415

    return offline.build_parser()


def orphans_parser() -> argparse.ArgumentParser:
    from proxy.cli import orphans  # noqa: PLC0415

    return orphans.build_parser()


def demo_parser() -> argparse.ArgumentParser:
    from proxy.cli import demo  # noqa: PLC0415

    return demo.build_parser()


PARSERS: dict[str, Callable[[], argparse.ArgumentParser]] = {
    "": proxy_parser,
    "run": run_parser,
    "settle": settle_parser,
    "orphans": orphans_parser,
    "demo": demo_parser,
}
"""The parser of each command, by the word that selects it (none for the proxy itself)."""


def command_word(arguments: list[str]) -> list[str]:
    """`arguments` without a leading `serve`; an unknown command word is one line suggesting the
    nearest command, exit 2 (a flag's value never comes first, so a first word is a command)."""
    if arguments[:1] == ["serve"]:
        return arguments[1:]
    if arguments and not arguments[0].startswith("-") and arguments[0] not in COMMANDS:
        nearest = difflib.get_close_matches(arguments[0], COMMANDS, n=1)
        hint = f"; did you mean {nearest[0]!r}?" if nearest else ""
        proxy_parser().error(f"unknown command {arguments[0]!r}{hint} (commands: {', '.join(COMMANDS)})")
    return arguments


def run_command(arguments: list[str]) -> None:
    """Run the command `arguments` select; the offline commands get SIGINT as Python's
    KeyboardInterrupt, which they say in one line themselves."""
    arguments = command_word(arguments)
    if arguments[:1] == ["settle"]:
        from proxy.cli import offline  # noqa: PLC0415

        signal.signal(signal.SIGINT, signal.default_int_handler)
        offline.main(arguments[1:])
        return
    if arguments[:1] == ["orphans"]:
        from proxy.cli import orphans  # noqa: PLC0415

        signal.signal(signal.SIGINT, signal.default_int_handler)
        orphans.main(arguments[1:])
        return
    if arguments[:1] == ["demo"]:
        from proxy.cli import demo  # noqa: PLC0415

        signal.signal(signal.SIGINT, signal.default_int_handler)
        demo.main(arguments[1:])
        return
    if arguments[:1] == ["run"]:
        from proxy.cli import run  # noqa: PLC0415

        args, settings, supervisor = run.parse(arguments[1:])
        run.refuse_an_unstartable_server(supervisor)
    else:
        args = proxy_parser().parse_args(arguments)
        settings, supervisor = settings_from(args), None
    from proxy.cli import serving  # noqa: PLC0415

    serving.main(args, settings, supervisor)
