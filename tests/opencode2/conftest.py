from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from proxy.demo.model import MockModel
from tests.integration.opencode_server import REPO_ROOT
from tests.opencode2.servers import REAL, REAL_2_1_2, RealServer, Server2x, StandInServer
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


STAND_INS = ("from source", "from source, compressing")
"""The servers no released 2.x is: the `v2` branch built from source (`/api/health`, version
`local`), and it compressing its answers; the release itself is the real 2.1.2."""


def real_2x_command() -> str:
    """`SETTLE_TEST_OPENCODE2`, else the pinned 2.1.2 (`npm install`, as `scripts/test` runs it)."""
    if command := os.environ.get(REAL):
        return command
    binary = REPO_ROOT / REAL_2_1_2
    if not binary.exists():
        raise FileNotFoundError(f"opencode 2.1.2 not found at {binary}: run `npm install` in the repo root")
    return f"{binary} serve --port {{port}} --hostname 127.0.0.1"


@pytest.fixture(params=["2.1.2", *STAND_INS])
async def server_2x(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Server2x]:
    """A 2.x server process, started: the real 2.1.2 (or the server `SETTLE_TEST_OPENCODE2`
    names), or a stand-in for a build no release is; stopped after the test."""
    server: Server2x
    if request.param in STAND_INS:
        server = StandInServer(tmp_path / "server", VARIANT_FLAGS[request.param])
    else:
        server = RealServer(tmp_path / "server", real_2x_command(), request.getfixturevalue("mock_model"))
    try:
        await server.start()
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def real_2x(tmp_path: Path, mock_model: MockModel) -> AsyncIterator[RealServer]:
    """The real 2.1.2 (or `SETTLE_TEST_OPENCODE2`'s server), started; stopped after the test."""
    server = RealServer(tmp_path / "server", real_2x_command(), mock_model)
    try:
        await server.start()
        yield server
    finally:
        await server.stop()
