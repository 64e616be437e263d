"""Fixtures of the reliability suite: fake upstreams, the proxy in-process or as a subprocess.

Every server binds 127.0.0.1 on a port the kernel picks (or one just found free) and is stopped
by the fixture or test that started it, in `finally`, so a failing test leaves nothing behind.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.reliability.background import Rig
from tests.reliability.bad_input import CASES


def pytest_configure(config: pytest.Config) -> None:
    """Register `slow` here so `-m "not slow"` works without touching pyproject.toml."""
    config.addinivalue_line("markers", "slow: takes seconds to minutes (load, races, real-server faults)")


@pytest.fixture(scope="module")
def rig() -> Iterator[Rig]:
    """A raw upstream and the proxy in a background thread, for a module of Hypothesis properties."""
    started = Rig()
    try:
        started.start()
        yield started
    finally:
        started.stop()
        print(f"\nbad input: {dict(CASES)}")
        CASES.clear()
