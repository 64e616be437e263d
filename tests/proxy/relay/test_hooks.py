"""The hook dispatcher: a failing addon is isolated, its changes undone, and `done` always runs."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict
from prometheus_client import CollectorRegistry, Counter
from yarl import URL

from proxy.addons.live.addon import LiveSettle
from proxy.addons.settle import Settle
from proxy.relay.hooks import Addon, Addons, ClaimedTwice, Flow, FlowKey
from proxy.service.app import create_app
from proxy.service.config import Settings
from proxy.supervision.server_command import free_loopback_port
from tests.fixtures import compact
from tests.proxy.conftest import ProxyClient
from tests.proxy.fake_opencode import FakeOpencode

V1 = "ses_dd6bcdaa7ffenxavFWr4GKPq95"


class Marks(Addon):
    name = "marks"

    async def response(self, flow: Flow) -> None:
        flow.response_headers["X-Marked"] = "yes"


class Breaks(Addon):
    name = "breaks"

    async def response(self, flow: Flow) -> None:
        flow.body = b"half-written"
        flow.response_headers["X-Broken"] = "yes"
        raise RuntimeError("boom")


def errors() -> Counter:
    return Counter("addon_errors", "test", ("addon", "hook"), registry=CollectorRegistry())


async def test_a_failing_hook_is_undone_and_the_others_keep_theirs() -> None:
    counter = errors()
    flow = Flow(make_mocked_request("GET", "/x"), CIMultiDict(), status=200, body=b"upstream")
    await Addons([Marks(), Breaks()], counter).trigger("response", flow)
    assert flow.body == b"upstream"
    assert dict(flow.response_headers) == {"X-Marked": "yes"}
    assert counter.labels("breaks", "response")._value.get() == 1


async def test_only_addons_that_implement_a_hook_are_called() -> None:
    calls: list[str] = []

    class Counts(Addon):
        name = "counts"

        async def done(self, flow: Flow) -> None:
            calls.append("done")

    addons = Addons([Marks(), Counts()], errors())
    flow = Flow(make_mocked_request("GET", "/x"), CIMultiDict())
    await addons.trigger("done", flow)
    await addons.trigger("request_headers", flow)
    assert calls == ["done"]


async def test_a_raising_settle_passes_the_upstreams_bytes(
    proxy: ProxyClient, fake: FakeOpencode, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def raising(self: Settle, flow: Flow) -> None:
        flow.body = b"{"
        raise RuntimeError("a bug in a rule")

    monkeypatch.setattr(Settle, "response", raising)
    body = compact("v1-message-stale-running.json")
    fake.bodies[f"/session/{V1}/message"] = body
    with caplog.at_level(logging.ERROR, logger="proxy.relay.hooks"):
        response = await proxy.get(f"/session/{V1}/message")
    assert response.status == 200
    assert await response.read() == body
    assert "X-Settle-Settled" not in response.headers
    assert "addon settle failed in response" in caplog.text
    metrics = await (await proxy.get("/_settle/metrics")).text()
    assert 'settle_proxy_addon_errors_total{addon="settle",hook="response"} 1.0' in metrics


async def test_done_runs_when_the_upstream_failed(
    aiohttp_client: Callable[[web.Application], Awaitable[ProxyClient]], monkeypatch: pytest.MonkeyPatch
) -> None:
    finished: list[str] = []

    async def done(self: LiveSettle, flow: Flow) -> None:
        finished.append(flow.request.path)

    monkeypatch.setattr(LiveSettle, "done", done)
    port = free_loopback_port()
    client = await aiohttp_client(create_app(Settings(upstream=URL(f"http://127.0.0.1:{port}"))))
    response = await client.get("/global/event")
    assert response.status == 502
    assert finished == ["/global/event"]


def request(path: str, method: str = "GET") -> web.Request:
    return make_mocked_request(method, path, app=web.Application())


class Claims(Addon):
    """Claims the body and the injected events, and keeps a mark in the flow."""

    name = "claims"

    async def request_headers(self, flow: Flow) -> None:
        flow[MARK] = self.name
        flow.start_timeout = 1.0
        flow.upstream_headers["X-Claims"] = "yes"

    async def response_headers(self, flow: Flow) -> None:
        flow.read_whole(by=self.name)
        flow.inject(asyncio.Queue(), by=self.name)

    async def done(self, flow: Flow) -> None:
        flow[MARK] = "done"


class ClaimsToo(Claims):
    """Fails halfway through each hook, after changing the flow."""

    name = "claims-too"

    async def request_headers(self, flow: Flow) -> None:
        await super().request_headers(flow)
        raise RuntimeError("boom")

    async def done(self, flow: Flow) -> None:
        raise RuntimeError("boom")


MARK = FlowKey[str]("mark")


async def test_a_failing_request_hook_is_undone_state_included() -> None:
    counter = errors()
    flow = Flow(request("/x"), CIMultiDict(), start_timeout=30.0)
    await Addons([Claims(), ClaimsToo()], counter).trigger("request_headers", flow)
    assert (flow[MARK], flow.start_timeout, flow.upstream_headers["X-Claims"]) == ("claims", 1.0, "yes")
    assert counter.labels("claims-too", "request_headers")._value.get() == 1


async def test_done_runs_for_every_addon_though_one_fails() -> None:
    flow = Flow(request("/x"), CIMultiDict())
    await Addons([ClaimsToo(), Claims()], errors()).trigger("done", flow)
    assert flow[MARK] == "done"


async def test_a_second_injector_is_refused_loudly_and_its_claims_undone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    counter = errors()
    flow = Flow(request("/x"), CIMultiDict(), status=200)
    first = Claims()
    with caplog.at_level(logging.ERROR, logger="proxy.relay.hooks"):
        await Addons([first, ClaimsToo()], counter).trigger("response_headers", flow)
    assert flow.read_whole_by == {"claims"}
    assert flow.injected is not None
    assert counter.labels("claims-too", "response_headers")._value.get() == 1
    assert "claims-too cannot inject into /x: claims does" in caplog.text


async def test_every_addon_that_reads_the_body_whole_is_named() -> None:
    flow = Flow(request("/x"), CIMultiDict())
    assert not flow.reads_whole
    flow.read_whole(by="one")
    flow.read_whole(by="two")
    assert flow.reads_whole
    assert flow.read_whole_by == {"one", "two"}


def test_a_second_injector_is_an_error() -> None:
    flow = Flow(request("/x"), CIMultiDict())
    flow.inject(asyncio.Queue(), by="one")
    with pytest.raises(ClaimedTwice, match="two cannot inject into /x: one does"):
        flow.inject(asyncio.Queue(), by="two")


async def test_addons_close_the_last_first() -> None:
    closed: list[str] = []

    class First(Addon):
        name = "first"

        async def close(self) -> None:
            closed.append(self.name)

    class Last(First):
        name = "last"

    await Addons([First(), Marks(), Last()], errors()).close()
    assert closed == ["last", "first"]


async def test_a_failing_response_headers_hook_is_undone_headers_included() -> None:
    class Edits(Addon):
        name = "edits"

        async def response_headers(self, flow: Flow) -> None:
            flow.response_headers["X-Edited"] = "yes"
            flow.status = 500
            flow[MARK] = "edited"
            raise RuntimeError("boom")

    flow = Flow(request("/x"), CIMultiDict(), status=200, response_headers=CIMultiDict({"A": "1"}))
    await Addons([Edits()], errors()).trigger("response_headers", flow)
    assert (flow.status, dict(flow.response_headers), flow.get(MARK)) == (200, {"A": "1"}, None)


async def test_a_failing_hook_gets_back_the_values_its_keys_held_not_what_it_changed_inside_one() -> None:
    """What `_Snapshot` says it covers: a key replaced or set is undone; a value changed in
    place is the addon's own object, kept as it is (the mapping is copied, not its values)."""
    held = FlowKey[list[str]]("held")

    class Edits(Addon):
        name = "edits"

        async def response(self, flow: Flow) -> None:
            flow[MARK] = "replaced"
            flow[held].append("inside")
            flow[FlowKey[int]("new")] = 1
            raise RuntimeError("boom")

    flow = Flow(request("/x"), CIMultiDict(), status=200)
    flow[MARK], flow[held] = "kept", []
    await Addons([Edits()], errors()).trigger("response", flow)
    assert (flow[MARK], len(flow.metadata)) == ("kept", 2)
    assert flow[held] == ["inside"]
