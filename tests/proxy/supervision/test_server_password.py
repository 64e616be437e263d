"""Auth on opencode 2.x: OPENCODE_PASSWORD is read as well as OPENCODE_SERVER_PASSWORD, and under
`run` a 2.x server with no password set gets one of the proxy's, the same at every start, shown
once in the log; a 1.x server is left without one, as it runs."""

from __future__ import annotations

import asyncio
import logging
import stat
import sys
from pathlib import Path

import pytest

from proxy.cli import run
from proxy.cli.options import opencode_authorization, opencode_password
from proxy.service.config import basic_authorization
from proxy.supervision import supervisor
from proxy.supervision.server_command import ServerCommand, free_loopback_port
from proxy.supervision.server_password import stable_password, wants_a_password
from proxy.supervision.supervisor import Restart, Supervisor
from tests.proxy.supervision.test_run import FAKE_SERVER
from tests.reliability.processes import eventually


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"OPENCODE_PASSWORD": "new"}, "new"),
        ({"OPENCODE_SERVER_PASSWORD": "old"}, "old"),
        ({"OPENCODE_PASSWORD": "new", "OPENCODE_SERVER_PASSWORD": "old"}, "new"),
        ({"OPENCODE_PASSWORD": "", "OPENCODE_SERVER_PASSWORD": "old"}, "old"),
        ({}, None),
    ],
)
def test_the_password_is_read_from_either_variable(environ: dict[str, str], expected: str | None) -> None:
    assert opencode_password(environ) == expected
    assert opencode_authorization(environ) == (expected and basic_authorization("opencode", expected))


def test_the_kept_password_is_made_once_and_readable_only_by_its_owner(tmp_path: Path) -> None:
    path = tmp_path / "state" / "server-password"
    first = stable_password(path)
    assert len(first) >= 32
    assert stable_password(path) == first
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert list(path.parent.iterdir()) == [path]


def fake_opencode(directory: Path, version: str) -> Path:
    """A program named `opencode` that prints `version` for `--version`."""
    program = directory / "opencode"
    program.write_text(f"#!/bin/sh\necho {version}\n")
    program.chmod(0o700)
    return program


@pytest.mark.parametrize(("version", "wanted"), [("2.1.2", True), ("1.18.33", False), ("garbage", False)])
def test_only_an_opencode_2_wants_a_password(tmp_path: Path, version: str, wanted: bool) -> None:
    assert wants_a_password(str(fake_opencode(tmp_path, version))) is wanted


def test_another_program_is_not_asked_its_version() -> None:
    assert not wants_a_password(sys.executable)  # Python 3 is no opencode 3


def _run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, version: str) -> tuple[str | None, Supervisor]:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    program = fake_opencode(tmp_path, version)
    _, settings, child = run.parse(["--", str(program), "serve"])
    return settings.authorization, child


def test_run_gives_a_2x_server_one_password_across_starts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("OPENCODE_PASSWORD", raising=False)
    monkeypatch.delenv("OPENCODE_SERVER_PASSWORD", raising=False)
    first, child = _run(monkeypatch, tmp_path, "2.1.2")
    password = (tmp_path / "state" / "settle-proxy" / "server-password").read_text()
    assert first == basic_authorization("opencode", password)
    environment = child._environment or {}
    assert environment["OPENCODE_PASSWORD"] == environment["OPENCODE_SERVER_PASSWORD"] == password
    again, _ = _run(monkeypatch, tmp_path, "2.1.2")
    assert again == first


def test_run_leaves_a_1x_server_and_a_set_password_alone(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("OPENCODE_PASSWORD", raising=False)
    monkeypatch.delenv("OPENCODE_SERVER_PASSWORD", raising=False)
    assert _run(monkeypatch, tmp_path, "1.18.33")[0] is None
    monkeypatch.setenv("OPENCODE_PASSWORD", "mine")
    authorization, child = _run(monkeypatch, tmp_path, "2.1.2")
    assert authorization == basic_authorization("opencode", "mine")
    assert child._environment is None  # the server reads it itself
    assert not (tmp_path / "state" / "settle-proxy" / "server-password").exists()


async def test_the_server_is_given_the_password_and_the_log_shows_it_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(supervisor, "become_subreaper", lambda: False)  # not for the test runner itself
    monkeypatch.setattr(supervisor, "BACKOFF_S", (0.01,))
    seen = tmp_path / "seen"
    # Each start appends the password it was given, answers a moment, then exits (a crash that is
    # restarted); `--port P --hostname H` land in $0 to $3, and are handed on.
    answer = f'exec "{sys.executable}" "{FAKE_SERVER}" --answer-for 1 --exit 1 "$0" "$@"'
    command = ServerCommand.parse(["sh", "-c", f'echo "$OPENCODE_PASSWORD" >> {seen}; {answer}'])
    child = Supervisor(
        command,
        free_loopback_port(),
        Restart.ON_FAILURE,
        environment={"OPENCODE_PASSWORD": "s3cret"},
        shown_password="s3cret",
    )
    caplog.set_level(logging.INFO, logger=supervisor.__name__)
    running = asyncio.create_task(child.run())
    assert await eventually(lambda: seen.exists() and seen.read_text().split() == ["s3cret", "s3cret"])
    await child.stop()
    running.cancel()
    lines = [record.getMessage() for record in caplog.records if "s3cret" in record.getMessage()]
    assert lines == ["server password s3cret"]
