"""A writer used outside the scheduler (the resume's) writes only into a server its mode writes
into: a 1.x release past 1.18, or a from-source build, is followed and told, never written into."""

from __future__ import annotations

import logging
from collections.abc import Collection

import pytest

from proxy.opencode.client import Credentials
from proxy.opencode.dialects import LINE_1_18
from proxy.opencode.server_line import TOLD_1_18, KnownServer, ServerLine
from proxy.writeback.modes import WriteBackMode
from proxy.writeback.scheduler import Confirm, ServersWrittenInto, Written
from rules import Api, Liveness


class Recording:
    mode = WriteBackMode.DB

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def write(
        self, api: Api, session_id: str, credentials: Credentials, targets: Collection[str], confirm: Confirm
    ) -> list[Written]:
        self.asked.append(session_id)
        return []


async def _confirm() -> Liveness:
    raise AssertionError("never asked: nothing is written")


@pytest.mark.parametrize("version", ["1.19.0", "local", "0.0.0-main-202611300000"])
async def test_nothing_is_written_into_a_server_no_writes_were_measured_on(
    version: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "proxy")
    inner = Recording()
    server = KnownServer(version, LINE_1_18, True, "/global/health", False)
    written = await ServersWrittenInto(inner, ServerLine.told(server)).write(
        Api.V1, "ses_1", Credentials(), ["prt_1"], _confirm
    )
    assert (written, inner.asked) == ([], [])
    assert f"opencode {version}" in caplog.text
    assert "is no release the proxy writes into" in caplog.text


async def test_a_release_of_the_line_is_written_into() -> None:
    inner = Recording()
    await ServersWrittenInto(inner, ServerLine.told(TOLD_1_18)).write(
        Api.V1, "ses_1", Credentials(), ["prt_1"], _confirm
    )
    assert inner.asked == ["ses_1"]
