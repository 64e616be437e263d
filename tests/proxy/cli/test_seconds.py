"""Every seconds flag of every command, and its variable, takes a finite number in the range its
help states: NaN, infinities, negatives and values past the bound get one line naming the flag or
the variable, and 0 only where the help says what 0 means. The parsers are walked, so a seconds
flag added later is held to it."""

from __future__ import annotations

import argparse
import re

import pytest

from proxy.cli.arguments import variable_of
from proxy.cli.commands import PARSERS
from tests.proxy.cli.test_every_flag import every_flag, find

ZERO_MEANS = {
    "--grace": "0 takes them back to back",
    "--response-timeout": "0 for no limit",
    "--resume-spacing": "0 admits them back to back",
}
"""The seconds flags whose help gives 0 a meaning, and the words that give it."""
BAD = ("nan", "NaN", "inf", "-inf", "-1", "1e9", "-0.5")
RANGE = re.compile(r"\((from 0 to|more than 0, at most) (\d+)\)")


def seconds_flags() -> list[tuple[str, str, str]]:
    """(command, prog, flag) of every flag whose help says it is a number of seconds."""
    return [
        (command, prog, flag)
        for command, prog, flag in every_flag()
        if (find(PARSERS[command](), prog, flag)[1].help or "").startswith("seconds")
    ]


FLAGS = [pytest.param(found, id=" ".join(found[1:])) for found in seconds_flags()]


def test_the_walk_finds_the_seconds_flags_the_issue_names() -> None:
    assert {
        "--resume-within",
        "--grace",
        "--liveness-timeout",
        "--connect-timeout",
        "--response-timeout",
    } <= {flag for _, _, flag in seconds_flags()}


def _refused(capsys: pytest.CaptureFixture[str], parser: argparse.ArgumentParser, args: list[str]) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(args)
    assert exited.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    return line


@pytest.mark.parametrize("found", FLAGS)
@pytest.mark.parametrize("text", BAD)
def test_a_seconds_value_out_of_range_gets_one_line_by_flag_and_by_variable(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    found: tuple[str, str, str],
    text: str,
) -> None:
    command, prog, flag = found
    build = PARSERS[command]
    parser, action = find(build(), prog, flag)
    variable = variable_of(action)
    monkeypatch.delenv(variable, raising=False)
    by_flag = _refused(capsys, parser, [f"{flag}={text}"])
    assert f"argument {flag}: a number of seconds" in by_flag
    monkeypatch.setenv(variable, text)
    by_variable = _refused(capsys, build(), [])
    assert f"{variable}: a number of seconds" in by_variable


@pytest.mark.parametrize("found", FLAGS)
def test_zero_is_taken_only_where_the_help_says_what_it_means(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, found: tuple[str, str, str]
) -> None:
    command, prog, flag = found
    parser, action = find(PARSERS[command](), prog, flag)
    monkeypatch.delenv(variable_of(action), raising=False)
    if flag in ZERO_MEANS:
        assert ZERO_MEANS[flag] in (action.help or "")
        assert getattr(parser.parse_args([flag, "0"]), action.dest) == 0
    else:
        assert f"argument {flag}: a number of seconds more than 0" in _refused(capsys, parser, [flag, "0"])


@pytest.mark.parametrize("found", FLAGS)
def test_the_help_states_the_range_and_its_bound_is_taken(
    monkeypatch: pytest.MonkeyPatch, found: tuple[str, str, str]
) -> None:
    command, prog, flag = found
    parser, action = find(PARSERS[command](), prog, flag)
    monkeypatch.delenv(variable_of(action), raising=False)
    stated = RANGE.search(action.help or "")
    assert stated is not None, action.help
    most = stated.group(2)
    assert getattr(parser.parse_args([flag, most]), action.dest) == float(most)
