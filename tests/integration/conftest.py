"""Fixtures for the integration suite: mock model, real opencode server, proxy subprocess.

The server is started once per test session (it is slow to boot); tests isolate themselves by
creating fresh sessions, not fresh servers. Every fixture tears its process down in `finally`,
so a failing test or an interrupted run leaves nothing behind.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .mock_model import MockModel
from .opencode_server import OpencodeServer, running_opencode
from .proxy_process import ProxyProcess


def pytest_configure(config: pytest.Config) -> None:
    """Register the marker here so `-m integration` works without touching pyproject.toml."""
    config.addinivalue_line(
        "markers", "integration: runs the real opencode server (slow, needs the npm binary)"
    )
    config.addinivalue_line("markers", "slow: takes seconds to minutes (load, races, real-server faults)")


@pytest.fixture(scope="session")
def mock_model() -> Iterator[MockModel]:
    """The mock OpenAI-compatible model every project's `mock` provider points at."""
    model = MockModel()
    model.start()
    try:
        yield model
    finally:
        model.stop()


@pytest.fixture(scope="session")
def opencode(mock_model: MockModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpencodeServer]:
    """The real `opencode serve`, shared by the whole test session; stopped with all its tools."""
    with running_opencode(tmp_path_factory.mktemp("opencode"), mock_model.base_url) as server:
        yield server


@pytest.fixture(scope="session")
def other_project(opencode: OpencodeServer) -> Path:
    """A second project directory: its sessions live in another opencode instance."""
    return opencode.add_project("other")


@pytest.fixture
def proxy_url(opencode: OpencodeServer, tmp_path: Path) -> Iterator[str]:
    """A fresh proxy in front of the server's current URL, so no proxy state leaks between tests."""
    proxy = ProxyProcess(opencode.url, tmp_path / "proxy.log")
    try:
        proxy.start()
        yield proxy.url
    finally:
        proxy.stop()
