"""What both command lines share: typed values whose errors say what was expected, never a secret."""

import argparse

import pytest

from proxy.cli.arguments import UPSTREAM, OneLineParser, typed


def test_an_upstream_url_is_checked() -> None:
    assert str(UPSTREAM("http://127.0.0.1:4096")) == "http://127.0.0.1:4096"
    with pytest.raises(argparse.ArgumentTypeError, match="its scheme is not http or https"):
        UPSTREAM("ftp://host")
    with pytest.raises(argparse.ArgumentTypeError, match="it has no host"):
        UPSTREAM("http://")
    with pytest.raises(argparse.ArgumentTypeError, match="it does not parse") as refused:
        UPSTREAM("http://127.0.0.1:99999/?auth_token=c2VjcmV0")
    assert "c2VjcmV0" not in str(refused.value)


def test_credentials_in_the_url_are_refused_without_echoing_them() -> None:
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        UPSTREAM("http://opencode:hunter2@127.0.0.1:4096")
    assert "hunter2" not in str(refused.value)
    assert "OPENCODE_SERVER_PASSWORD" in str(refused.value)


def test_a_secret_value_is_not_shown() -> None:
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        typed(int, "a number", secret=True)("hunter2")
    assert str(refused.value) == "a number, the value is not shown"


def test_a_bad_flag_gets_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    parser = OneLineParser(prog="settle-proxy")
    parser.add_argument("--grace", type=typed(float, "seconds"))
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(["--grace", "soon"])
    assert exited.value.code == 2
    assert capsys.readouterr().err == (
        "settle-proxy: error: argument --grace: seconds, got 'soon' (see --help)\n"
    )
