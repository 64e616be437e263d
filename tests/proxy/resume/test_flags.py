"""`--resume` and its flags on the command line, each with its SETTLE_* variable."""

from __future__ import annotations

import subprocess
import sys

import pytest

from proxy.cli.options import build_parser, settings_from
from proxy.cli.run import parse


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


def test_resume_without_write_back_is_refused_in_one_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "proxy", "--resume"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "settle-proxy: error: --resume needs --write-back api or db: the model must see the interrupted "
        "calls settled in the server's own storage"
    ]


@pytest.mark.parametrize("attempts", ["0", "-1", "many"])
def test_a_bad_budget_is_a_one_line_error(attempts: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser(environ={}).parse_args(["--resume-attempts", attempts])
    assert "--resume-attempts: a whole number of at least 1" in capsys.readouterr().err
