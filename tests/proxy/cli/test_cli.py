import sys
from pathlib import Path

import aiohttp
import orjson
import pytest
from aiohttp.test_utils import TestServer
from yarl import URL

from proxy import __version__
from proxy.cli.options import build_parser, settings_from
from tests.fixtures import compact
from tests.proxy.conftest import proxy_process, settle_proxy
from tests.proxy.fake_opencode import FakeOpencode

V1 = "ses_dd6bcdaa7ffenxavFWr4GKPq95"


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["--port", "http"], "argument --port: a port number from 0 to 65535, got 'http'"),
        (
            ["--upstream", "ftp://x"],
            "argument --upstream: an http(s) URL such as http://127.0.0.1:4096: its scheme is not http or "
            "https; the value is not shown",
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
    result = settle_proxy(*args)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.splitlines() == [f"settle-proxy: error: {complaint} (see --help)"]


def test_help_names_every_environment_variable() -> None:
    result = settle_proxy("--help")
    assert result.returncode == 0
    for variable in ("SETTLE_UPSTREAM", "SETTLE_HOST", "SETTLE_PORT", "OPENCODE_SERVER_PASSWORD"):
        assert variable in result.stdout


def test_version() -> None:
    assert settle_proxy("--version").stdout.strip() == f"settle-proxy {__version__}"


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
    result = settle_proxy(*args)
    assert result.returncode == 2
    assert "s3cret" not in result.stderr
    assert len(result.stderr.splitlines()) == 1


@pytest.mark.parametrize("url", ["http://opencode:hunter2@127.0.0.1:99999", "http://opencode:hunter2@[::1"])
@pytest.mark.parametrize("by", ["flag", "variable"])
def test_a_password_in_an_upstream_url_that_does_not_parse_is_not_echoed(url: str, by: str) -> None:
    """The URL fails to parse before its credentials could be found: the error shows none of it."""
    command = settle_proxy("--upstream", url) if by == "flag" else settle_proxy(env={"SETTLE_UPSTREAM": url})
    assert command.returncode == 2
    assert "hunter2" not in command.stderr + command.stdout
    assert "credentials do not belong in the URL" in command.stderr
    assert len(command.stderr.splitlines()) == 1


async def test_log_format_json_is_applied_end_to_end(
    fake: FakeOpencode, upstream: TestServer, tmp_path: Path
) -> None:
    """`--log-format json` as users start it: the settlement is one JSON line with its fields."""
    fake.bodies[f"/session/{V1}/message"] = compact("v1-message-stale-running.json")
    log_path = tmp_path / "proxy.log"
    async with (
        proxy_process(upstream, log_path, "--log-format", "json") as proxy,
        aiohttp.ClientSession() as client,
        client.get(proxy.with_path(f"/session/{V1}/message")) as response,
    ):
        assert response.headers.get("X-Settle-Settled") == "1"
    lines = [orjson.loads(line) for line in log_path.read_bytes().splitlines() if line.strip()]
    (settled,) = [line for line in lines if line.get("rule") == "orphaned-tool"]
    assert settled["event"] == "settled orphaned-tool"
    assert settled["level"] == "info"
    assert {settled[key] for key in ("session", "part", "tool")} == {
        V1,
        "prt_229433856001UdZM6dtgAYZqVe",
        "bash",
    }


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
async def test_the_proxy_as_users_start_it_fixes_the_heap_thresholds(
    upstream: TestServer, tmp_path: Path
) -> None:
    """README: the proxy fixes glibc's heap thresholds when it starts (`proxy/system/heap.py`)."""
    log_path = tmp_path / "proxy.log"
    async with proxy_process(upstream, log_path, "--log-level", "debug"):
        pass
    assert "C heap thresholds set" in log_path.read_text()
