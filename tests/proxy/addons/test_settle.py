"""The settle addon end to end: fake upstream → proxy → client."""

import json
from typing import Any

import orjson
import pytest

from proxy.addons.settle import SETTLED_HEADER
from tests.fixtures import compact, js_json, load, raw
from tests.proxy.conftest import ProxyClient, following, publish
from tests.proxy.fake_opencode import FakeOpencode

V2 = "ses_dd6bd0f33ffejRStwdnQDIkDom"
V1 = "ses_dd6bcdaa7ffenxavFWr4GKPq95"


async def fetch(proxy: ProxyClient, path: str) -> tuple[Any, bytes, dict[str, str]]:
    response = await proxy.get(path)
    assert response.status == 200
    body = await response.read()
    return orjson.loads(body), body, dict(response.headers)


@pytest.mark.parametrize("pretty", [False, True])
async def test_v2_stale_list_is_settled(proxy: ProxyClient, fake: FakeOpencode, pretty: bool) -> None:
    fake.bodies[f"/api/session/{V2}/message"] = (raw if pretty else compact)("v2-message-stale-running.json")
    document, _, headers = await fetch(proxy, f"/api/session/{V2}/message")
    tool = document["data"][0]["content"][0]
    assert tool["state"]["status"] == "error"
    assert tool["state"]["error"] == {"type": "unknown", "message": "Tool execution interrupted"}
    assert document["data"][0]["time"]["completed"] == tool["time"]["completed"]
    assert document["data"][1] == load("v2-message-stale-running.json")["data"][1]
    assert document["cursor"] == load("v2-message-stale-running.json")["cursor"]
    assert headers[SETTLED_HEADER] == "1"
    assert headers["X-Settle-Rules"] == "orphaned-tool,unfinished-message"


async def test_splice_leaves_untouched_bytes_alone(proxy: ProxyClient, fake: FakeOpencode) -> None:
    original = raw("v2-message-stale-running.json")
    fake.bodies[f"/api/session/{V2}/message"] = original
    _, body, _ = await fetch(proxy, f"/api/session/{V2}/message")
    user_message = original[original.index(b'    {\n      "id": "msg_22942f4d7') :]
    assert body.endswith(user_message)
    assert body.startswith(b'{\n  "data": [\n    {"id":"msg_22942f8cd001S0O0R7RZWGCalD"')


async def test_a_string_cut_inside_an_emoji_blinds_nothing(proxy: ProxyClient, fake: FakeOpencode) -> None:
    document = load("v2-message-stale-running.json")
    document["data"][0]["content"][0]["state"]["input"]["description"] = "demo \ud83d"
    document["data"][1]["text"] = "\ude00 run the demo"
    fake.bodies[f"/api/session/{V2}/message"] = js_json(document)
    response = await proxy.get(f"/api/session/{V2}/message")
    body = await response.read()
    assert response.headers[SETTLED_HEADER] == "1"
    assert body.endswith(
        b"," + js_json(document["data"][1]) + b'],"cursor":' + js_json(document["cursor"]) + b"}"
    )
    assert b'"description":"demo \\ud83d"' in body
    assert json.loads(body)["data"][0]["content"][0]["state"]["status"] == "error"


async def test_v1_stale_list_and_single_are_settled(proxy: ProxyClient, fake: FakeOpencode) -> None:
    messages = load("v1-message-stale-running.json")
    fake.bodies[f"/session/{V1}/message"] = compact("v1-message-stale-running.json")
    fake.bodies[f"/session/{V1}/message/{messages[1]['info']['id']}"] = orjson.dumps(messages[1])
    listed, _, _ = await fetch(proxy, f"/session/{V1}/message")
    single, _, headers = await fetch(proxy, f"/session/{V1}/message/{messages[1]['info']['id']}")
    assert listed[1] == single
    assert single["parts"][1]["state"]["status"] == "error"
    assert single["parts"][1]["state"]["metadata"] == {"output": "hello\n", "interrupted": True}
    assert single["info"]["error"]["name"] == "MessageAbortedError"
    assert listed[0] == messages[0]
    assert headers[SETTLED_HEADER] == "1"


async def test_v2_single_message(proxy: ProxyClient, fake: FakeOpencode) -> None:
    message = load("v2-message-stale-running.json")["data"][0]
    fake.bodies[f"/api/session/{V2}/message/{message['id']}"] = orjson.dumps({"data": message})
    document, _, _ = await fetch(proxy, f"/api/session/{V2}/message/{message['id']}")
    assert document["data"]["content"][0]["state"]["status"] == "error"


async def test_active_session_passes_byte_for_byte(proxy: ProxyClient, fake: FakeOpencode) -> None:
    fake.bodies[f"/api/session/{V2}/message"] = original = raw("v2-message-busy-running.json")
    busy = next(iter(load("v2-active-busy.json")["data"]))
    fake.v2_active.add(busy)
    path = f"/api/session/{busy}/message"
    fake.bodies[path] = original
    _, body, headers = await fetch(proxy, path)
    assert body == original
    assert SETTLED_HEADER not in headers


async def test_v1_liveness_is_asked_in_the_sessions_directory(proxy: ProxyClient, fake: FakeOpencode) -> None:
    await following(proxy)
    fake.bodies[f"/session/{V1}/message"] = original = compact("v1-message-stale-running.json")
    fake.directories[V1] = "/elsewhere"
    fake.v1_busy["/elsewhere"] = {V1}
    _, body, _ = await fetch(proxy, f"/session/{V1}/message")
    assert body == original
    fake.v1_busy["/elsewhere"] = set()
    await publish(proxy, fake, "session.status", V1, status={"type": "idle"})
    document, _, _ = await fetch(proxy, f"/session/{V1}/message")
    assert document[1]["parts"][1]["state"]["status"] == "error"


async def test_body_without_open_status_needs_no_liveness(proxy: ProxyClient, fake: FakeOpencode) -> None:
    fake.bodies[f"/api/session/{V2}/message"] = original = compact("v2-message-interrupted.json")
    _, body, _ = await fetch(proxy, f"/api/session/{V2}/message")
    assert body == original
    assert fake.liveness_requests == 0


@pytest.mark.parametrize(
    "body", [b'{"data": [', b"not json", b'{"data": {"x": 1}}', b'[{"info": 1, "running"}]']
)
async def test_malformed_bodies_pass_untouched(proxy: ProxyClient, fake: FakeOpencode, body: bytes) -> None:
    fake.bodies[f"/api/session/{V2}/message"] = body + b' "running"'
    response = await proxy.get(f"/api/session/{V2}/message")
    assert await response.read() == body + b' "running"'


async def test_unexpected_message_shape_passes_untouched(proxy: ProxyClient, fake: FakeOpencode) -> None:
    document = load("v2-message-stale-running.json")
    del document["data"][0]["time"]
    fake.bodies[f"/api/session/{V2}/message"] = original = orjson.dumps(document)
    _, body, _ = await fetch(proxy, f"/api/session/{V2}/message")
    assert body == original


@pytest.mark.parametrize("api", ["v1", "v2"])
async def test_unknown_liveness_means_no_rewrite(proxy: ProxyClient, fake: FakeOpencode, api: str) -> None:
    path = f"/session/{V1}/message" if api == "v1" else f"/api/session/{V2}/message"
    fake.bodies[path] = original = compact(f"{api}-message-stale-running.json")
    fake.liveness_fails = True
    _, body, headers = await fetch(proxy, path)
    assert body == original
    assert SETTLED_HEADER not in headers


async def test_stable_across_fetches(proxy: ProxyClient, fake: FakeOpencode) -> None:
    fake.bodies[f"/session/{V1}/message"] = compact("v1-message-stale-running.json")
    _, first, _ = await fetch(proxy, f"/session/{V1}/message")
    _, second, _ = await fetch(proxy, f"/session/{V1}/message")
    assert first == second


async def test_v1_session_moved_to_another_directory_is_asked_where_it_is(
    proxy: ProxyClient, fake: FakeOpencode
) -> None:
    """The directory the proxy last saw is only a guess: after a move, the old directory's
    instance says idle while the session is busy in its new one."""
    fake.events_refused = True
    fake.bodies[f"/session/{V1}/message"] = compact("v1-message-stale-running.json")
    document, _, _ = await fetch(proxy, f"/session/{V1}/message")
    assert document[1]["parts"][1]["state"]["status"] == "error"
    fake.directories[V1] = "/cwd/.worktrees/feature"
    fake.v1_busy["/cwd/.worktrees/feature"] = {V1}
    _, body, headers = await fetch(proxy, f"/session/{V1}/message")
    assert body == compact("v1-message-stale-running.json")
    assert SETTLED_HEADER not in headers
    assert [r.query.get("directory") for r in fake.seen if r.path == "/session/status"][-2:] == [
        "/cwd",
        "/cwd/.worktrees/feature",
    ]
