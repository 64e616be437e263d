from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.integration.mock_model import MockModel
from tests.opencode2.servers import REAL, RealServer, Server2x, StandInServer
from tests.opencode2.stand_in import VARIANT_FLAGS, StandIn


@pytest.fixture
async def stand_in() -> AsyncIterator[StandIn]:
    """A 2.1.2 stand-in on a free port of 127.0.0.1, stopped after the test."""
    async with StandIn() as server:
        yield server


@pytest.fixture
def mock_model() -> Iterator[MockModel]:
    """The mock OpenAI-compatible model a real 2.x server's project points at."""
    model = MockModel()
    model.start()
    try:
        yield model
    finally:
        model.stop()


@pytest.fixture(params=[*VARIANT_FLAGS, "real"])
async def server_2x(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Server2x]:
    """A 2.x server process, started: the stand-in, or the real server `SETTLE_TEST_OPENCODE2`
    names (skipped, with that reason, where it names none); stopped after the test."""
    server: Server2x
    if request.param in VARIANT_FLAGS:
        server = StandInServer(tmp_path / "server", VARIANT_FLAGS[request.param])
    elif command := os.environ.get(REAL):
        server = RealServer(tmp_path / "server", command, request.getfixturevalue("mock_model"))
    else:
        pytest.skip(f"{REAL} is not set: no real 2.x server command (with {{port}}) to run the scene against")
    try:
        await server.start()
        yield server
    finally:
        await server.stop()
