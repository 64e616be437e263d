"""Every write-back decision is one log line with the view path's structured fields, so that
`--log-format json` can follow a part from the view that settled it to its write."""

import logging
from typing import Any

import orjson
import pytest

from proxy import testing
from proxy.addons.settle import Settle
from proxy.opencode.client import Credentials, UpstreamApi
from proxy.opencode.liveness import LivenessProbe
from proxy.service.logs import JsonFormatter
from proxy.writeback.scheduler import WriteBack
from rules import Api
from tests.fixtures import compact
from tests.proxy.fake_opencode import FakeOpencode
from tests.proxy.writeback.test_scheduler import Recording
from tests.proxy.writeback.test_writeback import CALL, V1, V2, Show, v2_log

FIELDS = {"session", "message", "part", "mode", "api", "rule", "outcome", "why"}
MESSAGE = "msg_229432faa0010ifWjJPo42f8Zo"
PART = "prt_229433856001UdZM6dtgAYZqVe"


@pytest.fixture
def probe(upstream_api: UpstreamApi) -> LivenessProbe:
    return LivenessProbe(upstream_api)


def _json_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    """The write-back's log lines as `--log-format json` prints them."""
    formatter = JsonFormatter()
    return [orjson.loads(formatter.format(r)) for r in caplog.records if r.name.startswith("proxy.writeback")]


def _decided(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    assert lines, "premise: write-back decided something"
    for line in lines:
        assert line.keys() >= FIELDS, line
    return lines


async def test_a_write_and_a_skip_carry_session_part_and_mode(
    shown: Show, fake: FakeOpencode, caplog: pytest.LogCaptureFixture
) -> None:
    fake.bodies[f"/session/{V1}/message"] = compact("v1-message-stale-running.json")
    with caplog.at_level(logging.INFO, logger="proxy.writeback"):
        await shown(f"/session/{V1}/message")
    lines = _json_lines(caplog)
    by_outcome = {line["outcome"]: line for line in _decided(lines)}
    assert {key: by_outcome["written"][key] for key in FIELDS - {"why"}} == {
        "session": V1,
        "message": MESSAGE,
        "part": PART,
        "mode": "api",
        "api": "v1",
        "rule": "orphaned-tool",
        "outcome": "written",
    }
    # The API cannot close a v1 message: the message's own change is a skip, said as such.
    assert (by_outcome["skipped"]["message"], by_outcome["skipped"]["part"]) == (MESSAGE, None)
    assert by_outcome["skipped"]["session"] == V1


async def test_a_session_found_active_is_a_skip_per_named_id(
    asking: Settle, write_back: WriteBack, fake: FakeOpencode, caplog: pytest.LogCaptureFixture
) -> None:
    fake.bodies[f"/session/{V1}/message"] = compact("v1-message-stale-running.json")
    with caplog.at_level(logging.INFO, logger="proxy.writeback"):
        path = f"/session/{V1}/message"
        await testing.cycle(asking, testing.flow("GET", path, body=fake.bodies[path]))
        fake.v1_busy["/cwd"] = {V1}  # before the write-back's own reading
        await write_back.tasks.idle()
    lines = _json_lines(caplog)
    assert {(line["part"], line["outcome"], line["why"]) for line in _decided(lines)} == {
        (PART, "skipped", "the session became active"),
        (None, "skipped", "the API cannot change a message itself: its settlement stays in views"),
    }
    assert fake.patches == []


async def test_a_refused_append_carries_them_too(
    shown: Show, fake: FakeOpencode, caplog: pytest.LogCaptureFixture
) -> None:
    v2_log(fake)
    fake.before_replay = [{"aggregate_id": V2, "seq": 7, "type": "session.updated.1", "data": {}}]
    with caplog.at_level(logging.INFO, logger="proxy.writeback"):
        await shown(f"/api/session/{V2}/message")
    lines = _json_lines(caplog)
    outcomes = [(line["part"], line["api"], line["outcome"]) for line in _decided(lines)]
    assert (CALL, "v2", "retried") in outcomes
    assert (CALL, "v2", "written") in outcomes


@pytest.mark.parametrize("liveness_fails", [False, True])
async def test_a_failed_pass_is_a_failure_per_named_id(
    fake: FakeOpencode, caplog: pytest.LogCaptureFixture, liveness_fails: bool, probe: LivenessProbe
) -> None:
    fake.liveness_fails = liveness_fails
    write_back = WriteBack(probe, Recording(fails=True), grace=0)
    with caplog.at_level(logging.INFO, logger="proxy.writeback"):
        write_back.schedule(Api.V2, V2, Credentials(), {"call_1", "call_2"})
        await write_back.tasks.idle()
    lines = _decided(_json_lines(caplog))
    assert sorted((line["part"], line["outcome"], line["level"]) for line in lines) == [
        ("call_1", "failed", "warning"),
        ("call_2", "failed", "warning"),
    ]
    assert sum("exception" in line for line in lines) == (0 if liveness_fails else 1)


async def test_a_message_the_api_cannot_close_is_said_once_however_often_it_is_fetched(
    shown: Show, fake: FakeOpencode, caplog: pytest.LogCaptureFixture
) -> None:
    """A client refetching a view names its unfinished message each time: it is never written
    through the API, and said so once, not at every fetch."""
    fake.bodies[f"/session/{V1}/message"] = compact("v1-message-stale-running.json")
    with caplog.at_level(logging.INFO, logger="proxy.writeback"):
        for _ in range(3):
            await shown(f"/session/{V1}/message")
    view_only = [line for line in _json_lines(caplog) if line["why"].startswith("the API cannot change")]
    assert [(line["message"], line["outcome"]) for line in view_only] == [(MESSAGE, "skipped")]
