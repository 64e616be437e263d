"""The counting writer counts each pass by mode and outcome, whatever the pass did."""

from __future__ import annotations

from collections.abc import Collection

import pytest
from prometheus_client import CollectorRegistry, Counter

from proxy.opencode.client import Credentials
from proxy.writeback.modes import WriteBackMode
from proxy.writeback.scheduler import Confirm, CountingWriter, Written
from rules import Api, Liveness


class _Writer:
    mode = WriteBackMode.API

    def __init__(self, outcome: list[Written] | Exception) -> None:
        self._outcome = outcome

    async def write(
        self, api: Api, session_id: str, credentials: Credentials, targets: Collection[str], confirm: Confirm
    ) -> list[Written]:
        if isinstance(self._outcome, Exception):
            raise self._outcome
        return self._outcome


async def _confirm() -> Liveness:
    return Liveness("ses_1", active=False)


async def test_each_outcome_is_counted() -> None:
    registry = CollectorRegistry()
    counter = Counter("write_backs", "passes", ("mode", "outcome"), registry=registry)
    written = [Written(Api.V1, "ses_1", "msg_1", "prt_1", "orphaned-tool")]
    for outcome in (written, [], RuntimeError("down")):
        writer = CountingWriter(_Writer(outcome), counter)
        assert writer.mode is WriteBackMode.API
        if isinstance(outcome, Exception):
            with pytest.raises(RuntimeError):
                await writer.write(Api.V1, "ses_1", Credentials(), {"prt_1"}, _confirm)
        else:
            assert await writer.write(Api.V1, "ses_1", Credentials(), {"prt_1"}, _confirm) == outcome
    for result in ("written", "nothing", "failed"):
        assert registry.get_sample_value("write_backs_total", {"mode": "api", "outcome": result}) == 1
