"""The proxy in front of opencode's `v2` branch built from source, as measured @2092350c
(`StandIn.from_source`: version `local`, `GET /api/health` only): it is the 2.x line, so its
`/api/event` is followed and `/_settle/health` asks the route it answered; nothing is written
into it, said once; and it is asked as `opencode`, 2.x's one user, whatever
OPENCODE_SERVER_USERNAME says."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from proxy.service.app import ASSEMBLY
from proxy.writeback.modes import WriteBackMode
from tests.opencode2.database import opencode_sqlite
from tests.opencode2.proxied import PASSWORD, Client, proxied
from tests.opencode2.stand_in import StandIn

LINE_LOG = "proxy.opencode.server_line"


@pytest.mark.parametrize("mode", [WriteBackMode.API, WriteBackMode.DB])
async def test_a_from_source_build_is_followed_as_2x_and_never_written_into(
    aiohttp_client: Client, caplog: pytest.LogCaptureFixture, tmp_path: Path, mode: WriteBackMode
) -> None:
    caplog.set_level(logging.INFO, "proxy")
    database = opencode_sqlite(tmp_path / "opencode.db")
    before = database.read_bytes()
    async with (
        StandIn.from_source(password=PASSWORD) as server,
        proxied(server, aiohttp_client, write_back=mode, db_path=database, lock_dir=tmp_path) as (proxy, _),
    ):
        known = proxy.app[ASSEMBLY].started.line.current
        health = await (await proxy.get("/_settle/health", headers=server.headers)).json()
    assert known is not None
    assert (known.version, known.dialect.name, known.answered) == ("local", "2.x", "/api/health")
    assert (known.known_line, known.known_version) == (True, False)
    assert health["status"] == "ok"
    assert (health["upstream"]["status"], health["upstream"]["route"]) == (200, "/api/health")
    assert health["upstream"]["known_line"] is True
    assert health["liveness"]["event_stream"] == "following"
    said = [record for record in caplog.records if record.name == LINE_LOG]
    assert [record.levelno for record in said] == [logging.INFO]
    assert "version local, from-source build: the 2.x line, by its /api/health answer" in said[0].getMessage()
    warnings = [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]
    refused = [message for message in warnings if message.startswith(f"--write-back {mode} does nothing")]
    assert len(refused) == 1
    assert "no writer of the proxy's exists for the 2.x line" in refused[0]
    assert database.read_bytes() == before


async def test_2x_is_asked_as_opencode_whatever_opencode_server_username_says(
    aiohttp_client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    async with (
        StandIn.from_source(password=PASSWORD) as server,
        proxied(server, aiohttp_client, username="alice") as (
            proxy,
            _,
        ),  # follows /api/event: asked as opencode
    ):
        health = await (await proxy.get("/_settle/health", headers=server.headers)).json()
        active = await proxy.get("/api/session/active")  # a client that sent no credentials
        await active.read()
    assert health["upstream"]["status"] == 200
    assert "/api/health answered HTTP 401" not in caplog.text
    # A client's own request is relayed as it came: the proxy's credentials are never lent to it.
    assert active.status == 401
