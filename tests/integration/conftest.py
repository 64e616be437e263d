"""Fixtures for the integration suite: mock model, real opencode server, proxy subprocess.

The server is started once per test session (it is slow to boot); tests isolate themselves by
creating fresh sessions, not fresh servers. Every fixture tears its process down in `finally`,
so a failing test or an interrupted run leaves nothing behind.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from proxy.demo.model import MockModel

from .opencode_server import OpencodeServer, running_opencode
from .proxy_process import ProxyProcess

_FAILED = pytest.StashKey[bool]()
_LOG_LINES_SHOWN = 120


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Remember whether the test itself failed, for the fixtures that then show what they saw."""
    report = yield
    if call.when == "call" and report.failed:
        item.stash[_FAILED] = True
    return report


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
def proxy_url(opencode: OpencodeServer, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh proxy in front of the server's current URL, so no proxy state leaks between tests."""
    log = tmp_path / "proxy.log"
    proxy = ProxyProcess(opencode.url, log)
    try:
        proxy.start()
        yield proxy.url
    finally:
        proxy.stop()
        if request.node.stash.get(_FAILED, False) and log.exists():
            # A timing failure on a loaded machine can only be understood from what the proxy decided.
            lines = log.read_text(errors="replace").splitlines()
            print(
                f"--- the proxy's log, last {_LOG_LINES_SHOWN} lines ---",
                *lines[-_LOG_LINES_SHOWN:],
                sep="\n",
            )
