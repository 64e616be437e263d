"""Every flag of every command has an environment variable: named in its --help, and setting it
sets the flag. The parsers are walked, subcommands included, so a flag added later is held to it."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

from proxy.cli.arguments import OneLineParser
from proxy.cli.commands import PARSERS
from proxy.cli.options import DESCRIPTION

NOT_FLAGS = (argparse._HelpAction, argparse._VersionAction)
VARIABLE = re.compile(r"\[(SETTLE_[A-Z0-9_]+)[,\]]")
CANDIDATES = ("7", "0.5", "http://127.0.0.1:7", "user:pass", "/tmp/elsewhere")
"""Values tried for a flag that takes one: the first its type accepts, unlike its default, is set."""


def walk(parser: argparse.ArgumentParser) -> Iterator[tuple[argparse.ArgumentParser, argparse.Action]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command in action.choices.values():
                yield from walk(command)
        elif action.option_strings and not isinstance(action, NOT_FLAGS):
            yield parser, action


def every_flag() -> list[tuple[str, str, str]]:
    """(command, parser, flag) for every flag of every command."""
    return [
        (command, parser.prog, max(action.option_strings, key=len))
        for command, build in PARSERS.items()
        for parser, action in walk(build())
    ]


def find(
    parser: argparse.ArgumentParser, prog: str, flag: str
) -> tuple[argparse.ArgumentParser, argparse.Action]:
    for found, action in walk(parser):
        if found.prog == prog and flag in action.option_strings:
            return found, action
    raise AssertionError(f"{prog} {flag} is gone")


def a_value(action: argparse.Action) -> tuple[str, object]:
    """A value for the variable, and what the flag then holds."""
    if action.nargs == 0:
        return "1", action.const
    if isinstance(action, argparse._AppendAction):  # a repeatable flag: its variable holds a list
        return "7, 8", ["7", "8"]
    if action.choices is not None:
        choice = next(str(choice) for choice in action.choices if choice != action.default)
        return choice, choice
    convert = action.type if callable(action.type) else str
    default = convert(action.default) if isinstance(action.default, str) else action.default
    for text in CANDIDATES:
        try:
            value = convert(text)
        except (ValueError, argparse.ArgumentTypeError):
            continue
        if value != default:
            return text, value
    raise AssertionError(f"no value found for {action.option_strings}: add one to CANDIDATES")


def parsed(build: Callable[[], argparse.ArgumentParser], prog: str, flag: str) -> object:
    """What the flag holds when the command line does not give it."""
    parser, action = find(build(), prog, flag)
    return getattr(parser.parse_known_args([])[0], action.dest)


def settle_proxy(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`settle-proxy ARGS` with `env` added to the environment; a proxy that starts anyway (it
    should have refused) listens on a free port and is killed after a few seconds."""
    return subprocess.run(
        [sys.executable, "-m", "proxy", *args],
        env={**os.environ, "SETTLE_PORT": "0", **env},
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )


def test_the_walk_sees_every_command_and_the_flags_the_issue_names() -> None:
    assert set(re.findall(r"`settle-proxy (\w+) --help`", DESCRIPTION)) | {""} == set(PARSERS)
    flags = {(prog, flag) for _, prog, flag in every_flag()}
    assert {
        ("settle-proxy", "--upstream"),
        ("settle-proxy run", "--restart"),
        ("settle-proxy run", "--orphans"),
        ("settle-proxy settle", "--dry-run"),
        ("settle-proxy settle", "--upstream"),
        ("settle-proxy orphans", "--state"),
        ("settle-proxy orphans", "--terminate"),
    } <= flags


@pytest.mark.parametrize(
    ("command", "prog", "flag"), [pytest.param(*found, id=" ".join(found[1:])) for found in every_flag()]
)
def test_every_flag_has_an_environment_variable_that_its_help_names_and_that_sets_it(
    monkeypatch: pytest.MonkeyPatch, command: str, prog: str, flag: str
) -> None:
    build = PARSERS[command]
    parser, action = find(build(), prog, flag)
    help_text = parser.format_help()
    named = VARIABLE.findall(action.help or "")
    assert len(named) == 1, f"{prog} {flag}: its help names no SETTLE_* variable: {action.help!r}"
    (variable,) = named
    assert variable in help_text
    monkeypatch.delenv(variable, raising=False)
    text, expected = a_value(action)
    assert parsed(build, prog, flag) != expected
    monkeypatch.setenv(variable, text)
    assert parsed(build, prog, flag) == expected


@pytest.mark.parametrize(
    ("variable", "value", "args", "complaint"),
    [
        ("SETTLE_PORT", "http", [], "SETTLE_PORT: a port number from 0 to 65535, got 'http'"),
        ("SETTLE_WRITE_BACK", "sometimes", [], "SETTLE_WRITE_BACK: invalid choice 'sometimes' (choose from"),
        (
            "SETTLE_DRY_RUN",
            "maybe",
            [],
            "SETTLE_DRY_RUN: 1, true, yes or on, or 0, false, no or off, got 'maybe'",
        ),
        ("SETTLE_AUTH", "nopassword", [], "SETTLE_AUTH: USER:PASSWORD, the value is not shown"),
        (
            "SETTLE_RESTART",
            "sometimes",
            ["run", "--", "opencode"],
            "SETTLE_RESTART: invalid choice 'sometimes'",
        ),
        (
            "SETTLE_TERMINATE",
            "2",
            ["orphans"],
            "SETTLE_TERMINATE: 1, true, yes or on, or 0, false, no or off",
        ),
    ],
)
def test_a_bad_environment_value_gets_one_line_naming_the_variable(
    variable: str, value: str, args: list[str], complaint: str
) -> None:
    result = settle_proxy(*args, env={variable: value})
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert complaint in line
    assert line.startswith("settle-proxy")


def test_a_secret_from_the_environment_is_never_shown_in_help() -> None:
    result = settle_proxy("--help", env={"SETTLE_AUTH": "opencode:s3cret"})
    assert result.returncode == 0
    assert "s3cret" not in result.stdout
    assert "[SETTLE_AUTH]" in result.stdout


def test_a_flag_added_any_way_gets_its_variable() -> None:
    parser = OneLineParser(prog="p", environ={"SETTLE_NEW_FLAG": "3", "SETTLE_GROUPED": "yes"})
    parser.add_argument("--new-flag", type=int, default=1, help="plain")
    parser.add_argument_group("a group").add_argument("--grouped", action="store_true", help="grouped")
    assert parser.parse_args([]) == argparse.Namespace(new_flag=3, grouped=True)
    assert parser.parse_args(["--new-flag", "4"]).new_flag == 4
    shown = " ".join(parser.format_help().split())
    assert "plain [SETTLE_NEW_FLAG, default 3]" in shown
    assert "grouped [SETTLE_GROUPED]" in shown
