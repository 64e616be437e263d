"""`--resume` and its flags on the command line, each with its SETTLE_* variable."""

from __future__ import annotations

import pytest

from proxy.cli.options import build_parser, settings_from
from proxy.cli.run import parse
from proxy.writeback.modes import WriteBackMode


def test_resume_is_off_by_default() -> None:
    settings = settings_from(build_parser(environ={}).parse_args([]), {})
    assert (settings.resume, settings.resume_attempts, settings.resume_within, settings.resume_text) == (
        False,
        3,
        300.0,
        None,
    )


def test_every_resume_flag_has_its_variable() -> None:
    environ = {
        "SETTLE_RESUME": "1",
        "SETTLE_WRITE_BACK": "api",
        "SETTLE_RESUME_ATTEMPTS": "2",
        "SETTLE_RESUME_WITHIN": "60",
        "SETTLE_RESUME_TEXT": "go on",
    }
    settings = settings_from(build_parser(environ=environ).parse_args([]), environ)
    assert (settings.resume, settings.resume_attempts, settings.resume_within, settings.resume_text) == (
        True,
        2,
        60.0,
        "go on",
    )


def test_run_takes_the_resume_flags_too() -> None:
    _, settings, _ = parse(
        ["--resume", "--write-back", "db", "--resume-attempts", "1", "--", "opencode", "serve"]
    )
    assert (settings.resume, settings.resume_attempts) == (True, 1)


def test_resume_without_write_back_is_taken() -> None:
    """Whether a turn can be resumed without a write-back is the server's line's to say (2.x
    settles it itself; 1.18 cannot), and only the server says which it is."""
    settings = settings_from(build_parser(environ={}).parse_args(["--resume"]), {})
    assert (settings.resume, settings.write_back) == (True, WriteBackMode.OFF)


@pytest.mark.parametrize("attempts", ["0", "-1", "many"])
def test_a_bad_budget_is_a_one_line_error(attempts: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser(environ={}).parse_args(["--resume-attempts", attempts])
    assert "--resume-attempts: a whole number of at least 1" in capsys.readouterr().err
