"""The log as users start the proxy: JSON lines with an RFC 3339 time to the millisecond,
`--log-level debug` the proxy's own debug, not its libraries', and `--access-log`."""

from __future__ import annotations

import asyncio
import os
import re
from datetime import datetime
from pathlib import Path

import aiohttp
import orjson
import pytest
from aiohttp.test_utils import TestServer
from yarl import URL

from proxy.supervision.server_command import free_loopback_port
from tests.fixtures import compact
from tests.fixtures.stale_db import build_stale_db
from tests.proxy.conftest import proxy_process
from tests.proxy.fake_opencode import FakeOpencode

V1 = "ses_dd6bcdaa7ffenxavFWr4GKPq95"
RFC3339_MS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d")


async def test_json_lines_carry_an_rfc3339_time_and_debug_is_the_proxys_own(
    upstream: TestServer, tmp_path: Path
) -> None:
    """With `--write-back db` aiosqlite runs (and logs every call at debug): none of it shows."""
    db = build_stale_db(tmp_path / "opencode.db")
    log_path = tmp_path / "proxy.log"
    flags = ("--log-format", "json", "--log-level", "debug", "--write-back", "db", "--db", str(db))
    async with (
        proxy_process(upstream, log_path, *flags) as proxy,
        aiohttp.ClientSession() as client,
        client.get(proxy.with_path("/_settle/health")) as response,
    ):
        assert response.status == 200
    lines = [orjson.loads(line) for line in log_path.read_bytes().splitlines() if line.strip()]
    for line in lines:
        assert RFC3339_MS.fullmatch(line["time"]), line["time"]
        assert datetime.fromisoformat(line["time"]).utcoffset() is not None
    assert any(line["level"] == "debug" and line["logger"].startswith("proxy") for line in lines)
    assert {line["logger"] for line in lines if line["level"] == "debug"} <= {
        line["logger"] for line in lines if line["logger"].startswith("proxy")
    }
    assert not [line for line in lines if line["logger"].startswith("aiosqlite")]


async def test_access_log_is_one_line_per_request_without_query_secrets(
    fake: FakeOpencode, upstream: TestServer, tmp_path: Path
) -> None:
    fake.bodies[f"/session/{V1}/message"] = compact("v1-message-stale-running.json")
    log_path = tmp_path / "proxy.log"
    query = "?limit=5&auth_token=sekrit&apiKey=k3y"
    async with (
        proxy_process(upstream, log_path, "--access-log", "--log-format", "json") as proxy,
        aiohttp.ClientSession() as client,
    ):
        async with client.get(f"{proxy}/session/{V1}/message{query}") as response:
            body = await response.read()
            assert response.headers["X-Settle-Settled"] == "1"
        async with client.get(f"{proxy}/missing") as response:
            assert response.status == 404
    text = log_path.read_text()
    assert "sekrit" not in text
    assert "k3y" not in text
    lines = [orjson.loads(line) for line in text.splitlines() if line.strip()]
    access = [line for line in lines if line["logger"] == "proxy.access"]
    view, missing = access[-2:]
    assert view["event"] == f"GET /session/{V1}/message?limit=5&auth_token=***&apiKey=*** 200"
    assert (view["bytes"], view["settled"]) == (len(body), "1")
    assert isinstance(view["ms"], float)
    assert missing["event"] == "GET /missing 404"
    assert missing["settled"] == "-"


@pytest.mark.parametrize("env", [{}, {"SETTLE_ACCESS_LOG": "1"}], ids=["default", "variable"])
async def test_access_log_is_off_by_default_and_on_by_its_variable(
    upstream: TestServer, tmp_path: Path, env: dict[str, str]
) -> None:
    log_path = tmp_path / "proxy.log"
    async with (
        proxy_process(upstream, log_path, env={**os.environ, **env}) as proxy,
        aiohttp.ClientSession() as client,
        client.get(f"{proxy}/missing") as response,
    ):
        assert response.status == 404
    said = [line for line in log_path.read_text().splitlines() if "proxy.access: GET /missing 404" in line]
    if env:
        (line,) = said
        assert re.search(r" bytes=\d+ ms=[\d.]+ settled=-$", line), line
    else:
        assert said == []


async def _until_logged(log_path: Path, text: str) -> None:
    """Wait (bounded) for `text` in the proxy's log: another process tells this one nothing."""
    for _ in range(1200):
        if text in await asyncio.to_thread(log_path.read_text):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"never logged: {text}")


async def test_a_refused_upstream_is_one_warning_then_one_line_when_it_answers(
    fake: FakeOpencode, tmp_path: Path
) -> None:
    port = free_loopback_port()
    log_path = tmp_path / "proxy.log"
    server = TestServer(fake.app(), port=port)
    try:
        async with proxy_process(URL(f"http://127.0.0.1:{port}"), log_path):
            await _until_logged(log_path, "is not known yet (it cannot be reached: ")
            await server.start_server()
            await _until_logged(log_path, "upstream is opencode 1.18.33: the 1.18 line")
    finally:
        await server.close()  # after the proxy stopped: its lost stream is no news here
    lines = log_path.read_text().splitlines()
    (down,) = [line for line in lines if "it cannot be reached" in line]
    assert " WARNING proxy.opencode.server_line: the upstream's opencode server is not known yet (" in down
    assert len([line for line in lines if "upstream is opencode" in line]) == 1
