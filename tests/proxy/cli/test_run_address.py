"""`settle-proxy run`: the server command's --port/--hostname say where the proxy listens, so the
proxy's own --port/--host (or their variables) given as well would do nothing: refused, with one
line saying where the proxy listens, never silently ignored."""

from __future__ import annotations

import pytest

from proxy.cli.run import parse

SERVER = ["--", "opencode", "serve", "--port", "4096", "--hostname", "127.0.0.2"]


def _refused(capsys: pytest.CaptureFixture[str], arguments: list[str]) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        parse(arguments)
    assert exited.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    return line


@pytest.fixture(autouse=True)
def _no_address_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SETTLE_PORT", raising=False)
    monkeypatch.delenv("SETTLE_HOST", raising=False)


@pytest.mark.parametrize("own", [["--port", "5000"], ["--port=5000"]])
def test_an_explicit_port_beside_the_servers_is_refused(
    capsys: pytest.CaptureFixture[str], own: list[str]
) -> None:
    line = _refused(capsys, [*own, *SERVER])
    assert "--port does nothing under `run`" in line
    assert "the proxy listens on the server command's --port 4096" in line


def test_the_port_variable_beside_the_servers_port_is_refused(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SETTLE_PORT", "5000")
    assert "SETTLE_PORT does nothing under `run`" in _refused(capsys, SERVER)


def test_an_explicit_host_beside_the_servers_hostname_is_refused(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert "--host does nothing under `run`" in _refused(capsys, ["--host", "0.0.0.0", *SERVER])
    monkeypatch.setenv("SETTLE_HOST", "0.0.0.0")
    assert "SETTLE_HOST does nothing under `run`" in _refused(capsys, SERVER)


def test_an_abbreviated_flag_cannot_slip_past(capsys: pytest.CaptureFixture[str]) -> None:
    assert "unrecognized arguments: --po" in _refused(capsys, ["--po", "5000", *SERVER])


def test_where_the_server_command_asks_nothing_the_proxys_own_address_applies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, settings, _ = parse(["--port", "5000", "--host", "127.0.0.3", "--", "opencode", "serve"])
    assert (settings.host, settings.port) == ("127.0.0.3", 5000)
    monkeypatch.setenv("SETTLE_PORT", "5001")
    assert parse(["--", "opencode", "serve"])[1].port == 5001


def test_the_server_commands_address_is_the_proxys() -> None:
    _, settings, supervisor = parse(SERVER)
    assert (settings.host, settings.port) == ("127.0.0.2", 4096)
    assert supervisor.command[-4:-2] == ["--port", str(settings.upstream.port)]
