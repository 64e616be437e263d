"""The settle addon's hooks, one flow at a time through `proxy.testing.cycle` (no proxy in front)."""

import orjson
import pytest

from proxy import testing
from proxy.addons.settle import SETTLED_HEADER, Settle
from tests.fixtures import compact
from tests.proxy.fake_opencode import FakeOpencode

V1 = "ses_dd6bcdaa7ffenxavFWr4GKPq95"
VIEW = f"/session/{V1}/message"
STALE = compact("v1-message-stale-running.json")


async def test_a_stale_view_of_an_idle_session_is_settled(settle: Settle) -> None:
    flow = await testing.cycle(settle, testing.flow("GET", VIEW, body=STALE))
    assert flow.read_body
    assert flow.response_headers[SETTLED_HEADER] == "1"
    assert orjson.loads(flow.body)[1]["parts"][1]["state"]["status"] == "error"


async def test_a_message_view_is_asked_for_uncompressed(settle: Settle) -> None:
    flow = testing.flow("GET", VIEW, headers={"Accept-Encoding": "gzip, br"}, body=STALE)
    await testing.cycle(settle, flow)
    assert flow.upstream_headers["Accept-Encoding"] == "identity"
    other = await testing.cycle(settle, testing.flow("GET", "/config", headers={"Accept-Encoding": "gzip"}))
    assert other.upstream_headers["Accept-Encoding"] == "gzip"
    assert not other.read_body


async def test_a_busy_session_keeps_its_view(settle: Settle, fake: FakeOpencode) -> None:
    fake.v1_busy["/cwd"] = {V1}
    flow = await testing.cycle(settle, testing.flow("GET", VIEW, body=STALE))
    assert flow.body == STALE
    assert SETTLED_HEADER not in flow.response_headers


async def test_unknown_liveness_passes_the_view_unchanged(settle: Settle, fake: FakeOpencode) -> None:
    fake.liveness_fails = True
    flow = await testing.cycle(settle, testing.flow("GET", VIEW, body=STALE))
    assert flow.body == STALE
    assert SETTLED_HEADER not in flow.response_headers


@pytest.mark.parametrize(
    ("status", "content_type"), [(404, "application/json"), (200, "text/html"), (200, "text/event-stream")]
)
async def test_only_a_json_answer_of_200_is_read(settle: Settle, status: int, content_type: str) -> None:
    flow = testing.flow(
        "GET", VIEW, status=status, response_headers={"Content-Type": content_type}, body=STALE
    )
    await testing.cycle(settle, flow)
    assert not flow.read_body
    assert flow.body == STALE
