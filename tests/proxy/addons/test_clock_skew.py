"""Freshness is judged in the server's clock: a proxy whose clock is an hour off either way
never settles a tool the server saw alive an instant before its reading (asked by the settle
addon through `proxy.testing`, or kept from the stream a whole proxy follows)."""

import logging
import time
from typing import Any

import orjson
import pytest

from proxy import testing
from proxy.addons.settle import SETTLED_HEADER, Settle
from proxy.opencode.server_clock import parse_date
from rules import Doubt
from tests.fixtures import load
from tests.proxy.conftest import ProxyClient, following, publish
from tests.proxy.fake_opencode import FakeOpencode

V1 = "ses_dd6bcdaa7ffenxavFWr4GKPq95"
PATH = f"/session/{V1}/message"
HOUR_MS = 3_600_000


def v1_last_alive_at(moment: int) -> bytes:
    """The stale v1 history, with its running tool last alive at `moment` (epoch ms)."""
    messages: list[Any] = load("v1-message-stale-running.json")
    messages[1]["info"]["time"] = {"created": moment - 1_000}
    messages[1]["parts"][1]["state"]["time"] = {"start": moment}
    return orjson.dumps(messages)


def server_now(fake: FakeOpencode) -> int:
    return int(time.time() * 1000) + fake.clock_skew_ms


async def settled(proxy: ProxyClient) -> bool:
    response = await proxy.get(PATH)
    assert response.status == 200
    return SETTLED_HEADER in response.headers


async def settles(settle: Settle, body: bytes) -> bool:
    """Whether the addon settles the view `body`, with a reading it asks of the fake."""
    flow = await testing.cycle(settle, testing.flow("GET", PATH, body=body))
    return SETTLED_HEADER in flow.response_headers


@pytest.mark.parametrize("skew", [-HOUR_MS, HOUR_MS], ids=["server-behind", "server-ahead"])
async def test_asked_reading_is_timed_by_the_servers_date(
    settle: Settle, fake: FakeOpencode, skew: int
) -> None:
    fake.clock_skew_ms = skew
    assert not await settles(settle, v1_last_alive_at(server_now(fake) - 500))
    assert await settles(settle, v1_last_alive_at(server_now(fake) - 10_000))


@pytest.mark.parametrize("skew", [-HOUR_MS, HOUR_MS], ids=["server-behind", "server-ahead"])
async def test_kept_reading_is_timed_by_the_streams_date(
    proxy: ProxyClient, fake: FakeOpencode, skew: int
) -> None:
    fake.clock_skew_ms = skew
    await following(proxy)
    await publish(proxy, fake, "session.status", V1, status={"type": "idle"})
    fake.bodies[PATH] = v1_last_alive_at(server_now(fake) - 500)
    assert not await settled(proxy)
    fake.bodies[PATH] = v1_last_alive_at(server_now(fake) - 10_000)
    assert await settled(proxy)


async def test_a_tool_too_fresh_for_one_reading_is_settled_by_a_later_one(
    settle: Settle, fake: FakeOpencode, caplog: pytest.LogCaptureFixture
) -> None:
    """The same bytes are decided afresh once a reading can vouch for them; the log says why
    they were left open meanwhile."""
    caplog.set_level(logging.INFO, logger="proxy.addons.settle")
    body = v1_last_alive_at(server_now(fake) - 500)
    assert not await settles(settle, body)
    said = [record for record in caplog.records if record.getMessage().startswith("left message")]
    assert [getattr(record, "fields")["why"] for record in said] == [str(Doubt.TOO_RECENT)]  # noqa: B009
    fake.clock_skew_ms += (
        3_200  # the server's clock moves on: the margin (2 s), plus `Date`'s truncation (< 1 s)
    )
    assert await settles(settle, body)


def test_date_headers_are_read_to_the_second_or_not_at_all() -> None:
    assert parse_date("Mon, 30 Nov 2026 17:39:12 GMT") == 1_796_060_352_000
    assert parse_date("yesterday") is None
    assert parse_date(None) is None
