from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.opencode2.stand_in import StandIn


@pytest.fixture
async def stand_in() -> AsyncIterator[StandIn]:
    """A 2.1.2 stand-in on a free port of 127.0.0.1, stopped after the test."""
    async with StandIn() as server:
        yield server
