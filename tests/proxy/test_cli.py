import subprocess
import sys

import pytest
from yarl import URL

from proxy import __version__
from proxy.cli import build_parser, settings_from


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy", *args], capture_output=True, text=True, timeout=30, check=False
    )


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["--port", "http"], "argument --port: a port number from 0 to 65535, got 'http'"),
        (
            ["--upstream", "ftp://x"],
            "argument --upstream: an http(s) URL such as http://127.0.0.1:4096, got 'ftp://x'",
        ),
        (["--bogus"], "unrecognized arguments: --bogus"),
        (
            ["--upstream", "http://opencode:s3cret@127.0.0.1:4096"],
            "argument --upstream: credentials do not belong in the URL (anyone can read a command line); "
            "set OPENCODE_SERVER_PASSWORD and OPENCODE_SERVER_USERNAME",
        ),
    ],
)
def test_a_bad_flag_gets_one_clear_line(args: list[str], complaint: str) -> None:
    result = run_cli(*args)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.splitlines() == [f"settle-proxy: error: {complaint} (see --help)"]


def test_help_names_every_environment_variable() -> None:
    result = run_cli("--help")
    assert result.returncode == 0
    for variable in ("SETTLE_UPSTREAM", "SETTLE_HOST", "SETTLE_PORT", "OPENCODE_SERVER_PASSWORD"):
        assert variable in result.stdout


def test_version() -> None:
    assert run_cli("--version").stdout.strip() == f"settle-proxy {__version__}"


def test_flags_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SETTLE_UPSTREAM", "http://127.0.0.1:5000")
    monkeypatch.setenv("SETTLE_PORT", "5001")
    monkeypatch.setenv("OPENCODE_SERVER_PASSWORD", "s3cret")
    settings = settings_from(build_parser().parse_args([]))
    assert settings.upstream == URL("http://127.0.0.1:5000")
    assert settings.port == 5001
    assert settings.host == "127.0.0.1"
    assert settings.authorization == "Basic b3BlbmNvZGU6czNjcmV0"
    assert "s3cret" not in repr(settings)


def test_flags_beat_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SETTLE_PORT", "5001")
    monkeypatch.delenv("OPENCODE_SERVER_PASSWORD", raising=False)
    settings = settings_from(build_parser().parse_args(["--port", "6000"]))
    assert settings.port == 6000
    assert settings.authorization is None


@pytest.mark.parametrize(
    "args",
    [
        ["--upstream", "http://opencode:s3cret@127.0.0.1:4096"],
        ["settle", "--upstream", "http://opencode:s3cret@127.0.0.1:4096"],
        ["--auth", "s3cret"],
    ],
)
def test_a_secret_in_a_bad_flag_is_not_echoed(args: list[str]) -> None:
    result = run_cli(*args)
    assert result.returncode == 2
    assert "s3cret" not in result.stderr
    assert len(result.stderr.splitlines()) == 1
