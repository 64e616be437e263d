"""A rule written here, with a trigger no built-in rule has, runs on the view path once it is
registered: nothing else in the proxy or the rules names it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any, ClassVar

import aiohttp
import orjson
import pytest
from yarl import URL

from proxy import testing
from proxy.addons.context import SettleContext
from proxy.addons.settle import RULES_HEADER, SETTLED_HEADER, Settle
from proxy.opencode.client import UpstreamApi
from proxy.opencode.liveness import LivenessProbe
from proxy.opencode.tracker import LivenessTracker
from proxy.service.metrics import Metrics
from rules import (
    DEFAULT_RULES,
    REGISTRY,
    Api,
    Change,
    Liveness,
    Message,
    Registry,
    Target,
    Trigger,
    V1Message,
    runtime_for,
    runtime_of,
)
from tests.fixtures import load
from tests.proxy.fake_opencode import FakeOpencode

V1 = "ses_dd6bcdaa7ffenxavFWr4GKPq95"
VIEW = f"/session/{V1}/message"
_MARK = b'"marker":"stale"'


class StaleMarker:
    """Finds `"marker":"stale"` in a message's header: neither an open tool nor an unfinished
    message, so only this trigger can bring it to the rules."""

    calls = 0

    def positions(self, body: bytes, api: Api) -> Iterator[int]:
        StaleMarker.calls += 1
        position = body.find(_MARK)
        while position >= 0:
            yield position
            position = body.find(_MARK, position + 1)

    def matches(self, raw_message: Any, api: Api) -> bool:
        header = runtime_of(api).header(raw_message)
        return type(header) is dict and header.get("marker") == "stale"


class ClearsStaleMarker:
    name: ClassVar[str] = "clears-stale-marker"
    trigger: ClassVar[Trigger] = StaleMarker()
    durable: ClassVar[frozenset[Api]] = frozenset()

    def __call__(self, message: Message, liveness: Liveness) -> list[Change]:
        runtime = runtime_for(message)
        if not isinstance(message, V1Message) or not liveness.vouches_for(runtime.last_alive(message)):
            return []
        target: Target = runtime.target(message)
        return [Change(self.name, target, {"marker": "settled"}, "marked stale", runtime.header_path)]


def marked_view() -> bytes:
    """A settled v1 view (no open tool, every assistant message finished) with one marked message."""
    messages = load("v1-message-after-patch.json")
    info = messages[1]["info"]
    info["time"]["completed"] = info["time"]["created"] + 1
    info["marker"] = "stale"
    return orjson.dumps(messages)


@pytest.fixture
async def registry_settle(upstream_api: UpstreamApi) -> AsyncIterator[Settle]:
    registry = Registry(DEFAULT_RULES)
    registry.register(ClearsStaleMarker())
    async with aiohttp.ClientSession() as session:
        tracker = LivenessTracker(session, URL("http://127.0.0.1:1"))
        ctx = SettleContext(LivenessProbe(upstream_api), upstream_api, Metrics(), grace=0)
        yield Settle(ctx, tracker=tracker, rules=registry)


async def test_a_registered_rule_with_its_own_trigger_settles_a_view(
    registry_settle: Settle, fake: FakeOpencode
) -> None:
    StaleMarker.calls = 0
    flow = await testing.cycle(registry_settle, testing.flow("GET", VIEW, body=marked_view()))
    assert orjson.loads(flow.body)[1]["info"]["marker"] == "settled"
    assert flow.response_headers[RULES_HEADER] == "clears-stale-marker"
    assert flow.response_headers[SETTLED_HEADER] == "0"  # a change to the message, not to a tool
    assert fake.liveness_requests == 1
    assert StaleMarker.calls == 1, "the body is scanned once, its offsets reused to pick the messages"


async def test_a_busy_session_keeps_the_marker(registry_settle: Settle, fake: FakeOpencode) -> None:
    fake.v1_busy["/cwd"] = {V1}
    flow = await testing.cycle(registry_settle, testing.flow("GET", VIEW, body=marked_view()))
    assert orjson.loads(flow.body)[1]["info"]["marker"] == "stale"
    assert RULES_HEADER not in flow.response_headers


def test_the_rule_is_not_in_the_default_registry_nor_durable_anywhere() -> None:
    assert "clears-stale-marker" not in {rule.name for rule in REGISTRY}
    registry = Registry([ClearsStaleMarker()])
    assert not registry.durable(Api.V1)
    assert not registry.durable(Api.V2)
