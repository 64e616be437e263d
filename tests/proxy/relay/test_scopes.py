"""Scopes: an addon is called only for the flows it acts on, and a flow no addon claimed takes
no snapshot, whatever addons the application has."""

from __future__ import annotations

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict
from prometheus_client import CollectorRegistry, Counter

from proxy.relay import hooks
from proxy.relay.hooks import Addon, Addons, Flow, FlowKey
from tests.proxy.conftest import ProxyClient


def errors() -> Counter:
    return Counter("addon_errors", "test", ("addon", "hook"), registry=CollectorRegistry())


def request(path: str) -> web.Request:
    return make_mocked_request("GET", path, app=web.Application())


@pytest.fixture
def snapshots(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The hooks the dispatcher takes a snapshot of the flow for, in order."""
    taken: list[str] = []
    original = hooks._Snapshot.of

    def counting(flow: Flow, hook: hooks.Hook) -> hooks._Snapshot:
        taken.append(hook)
        return original(flow, hook)

    monkeypatch.setattr(hooks._Snapshot, "of", staticmethod(counting))
    return taken


class Records(Addon):
    """Notes each hook it is called for, and changes nothing."""

    name = "records"

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def request_headers(self, flow: Flow) -> None:
        self.calls.append("request_headers")

    async def response_headers(self, flow: Flow) -> None:
        self.calls.append("response_headers")

    async def response(self, flow: Flow) -> None:
        self.calls.append("response")

    async def done(self, flow: Flow) -> None:
        self.calls.append("done")


SCOPED = FlowKey[bool]("scoped")


async def test_an_addon_is_called_only_for_the_flows_in_its_scope() -> None:
    outside, inside = Records(), Records()
    outside.scope, inside.scope = (lambda f: False), (lambda f: True)
    addons = Addons([outside, inside], errors())
    flow = Flow(request("/x"), CIMultiDict())
    for hook in ("request_headers", "response_headers", "response", "done"):
        await addons.trigger(hook, flow)
    assert outside.calls == []
    assert inside.calls == ["request_headers", "response_headers", "response", "done"]


async def test_a_scope_is_read_from_what_earlier_hooks_put_in_the_flow() -> None:
    class Scopes(Addon):
        name = "scopes"

        async def request_headers(self, flow: Flow) -> None:
            flow[SCOPED] = flow.request.path == "/in"

    def scoped(flow: Flow) -> bool:
        return flow.get(SCOPED) is True

    later = Records()
    later.scope = scoped
    addons = Addons([Scopes(), later], errors())
    for path in ("/out", "/in"):
        flow = Flow(request(path), CIMultiDict())
        await addons.trigger("request_headers", flow)
        await addons.trigger("done", flow)
    assert later.calls == ["request_headers", "done"]


async def test_a_flow_no_addon_claimed_takes_no_snapshot(snapshots: list[str]) -> None:
    outside = Records()
    outside.scope = lambda f: False
    addons = Addons([outside], errors())
    flow = Flow(request("/x"), CIMultiDict())
    for hook in ("request_headers", "response_headers", "response", "done"):
        await addons.trigger(hook, flow)
    assert snapshots == []


async def test_a_plain_route_runs_only_the_routing_hook(proxy: ProxyClient, snapshots: list[str]) -> None:
    response = await proxy.get("/echo")
    assert response.status == 200
    assert snapshots == ["request_headers"]
