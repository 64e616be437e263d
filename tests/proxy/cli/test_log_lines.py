"""The log as users start the proxy: JSON lines with an RFC 3339 time to the millisecond, and
`--log-level debug` the proxy's own debug, not its libraries'."""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

import aiohttp
import orjson
from aiohttp.test_utils import TestServer

from tests.fixtures.stale_db import build_stale_db
from tests.proxy.conftest import proxy_process

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
