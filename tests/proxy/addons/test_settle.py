"""The settle addon: one view at a time through `proxy.testing.cycle` (the body as the upstream
sent it, liveness asked of the fake), and once end to end, fake upstream → proxy → client."""

import json
from collections.abc import Mapping
from typing import Any

import orjson
import pytest

from proxy import testing
from proxy.addons.settle import SETTLED_HEADER, Settle
from tests.fixtures import compact, js_json, load, raw
from tests.proxy.conftest import ProxyClient
from tests.proxy.fake_opencode import FakeOpencode

V2 = "ses_dd6bd0f33ffejRStwdnQDIkDom"
V1 = "ses_dd6bcdaa7ffenxavFWr4GKPq95"
V1_VIEW = f"/session/{V1}/message"
V2_VIEW = f"/api/session/{V2}/message"


async def sent(settle: Settle, path: str, body: bytes) -> tuple[bytes, Mapping[str, str]]:
    """What the client is sent for `path` when the upstream answers `body`: bytes and headers."""
    flow = await testing.cycle(settle, testing.flow("GET", path, body=body))
    assert flow.status == 200
    return flow.body, flow.response_headers


async def settled(settle: Settle, path: str, body: bytes) -> Any:
    return orjson.loads((await sent(settle, path, body))[0])


@pytest.mark.parametrize("pretty", [False, True])
async def test_v2_stale_list_is_settled_end_to_end(
    proxy: ProxyClient, fake: FakeOpencode, pretty: bool
) -> None:
    fake.bodies[V2_VIEW] = (raw if pretty else compact)("v2-message-stale-running.json")
    response = await proxy.get(V2_VIEW)
    assert response.status == 200
    document = orjson.loads(await response.read())
    tool = document["data"][0]["content"][0]
    assert tool["state"]["status"] == "error"
    assert tool["state"]["error"] == {"type": "unknown", "message": "Tool execution interrupted"}
    assert document["data"][0]["time"]["completed"] == tool["time"]["completed"]
    assert document["data"][1] == load("v2-message-stale-running.json")["data"][1]
    assert document["cursor"] == load("v2-message-stale-running.json")["cursor"]
    assert response.headers[SETTLED_HEADER] == "1"
    assert response.headers["X-Settle-Rules"] == "orphaned-tool,unfinished-message"


async def test_splice_leaves_untouched_bytes_alone(settle: Settle) -> None:
    original = raw("v2-message-stale-running.json")
    body, _ = await sent(settle, V2_VIEW, original)
    user_message = original[original.index(b'    {\n      "id": "msg_22942f4d7') :]
    assert body.endswith(user_message)
    assert body.startswith(b'{\n  "data": [\n    {"id":"msg_22942f8cd001S0O0R7RZWGCalD"')


async def test_a_string_cut_inside_an_emoji_blinds_nothing(settle: Settle) -> None:
    document = load("v2-message-stale-running.json")
    document["data"][0]["content"][0]["state"]["input"]["description"] = "demo \ud83d"
    document["data"][1]["text"] = "\ude00 run the demo"
    body, headers = await sent(settle, V2_VIEW, js_json(document))
    assert headers[SETTLED_HEADER] == "1"
    assert body.endswith(
        b"," + js_json(document["data"][1]) + b'],"cursor":' + js_json(document["cursor"]) + b"}"
    )
    assert b'"description":"demo \\ud83d"' in body
    assert json.loads(body)["data"][0]["content"][0]["state"]["status"] == "error"


async def test_v1_stale_list_and_single_are_settled(settle: Settle) -> None:
    messages = load("v1-message-stale-running.json")
    listed = await settled(settle, V1_VIEW, compact("v1-message-stale-running.json"))
    body, headers = await sent(settle, f"{V1_VIEW}/{messages[1]['info']['id']}", orjson.dumps(messages[1]))
    single = orjson.loads(body)
    assert listed[1] == single
    assert single["parts"][1]["state"]["status"] == "error"
    assert single["parts"][1]["state"]["metadata"] == {"output": "hello\n", "interrupted": True}
    assert single["info"]["error"]["name"] == "MessageAbortedError"
    assert listed[0] == messages[0]
    assert headers[SETTLED_HEADER] == "1"


async def test_v2_single_message(settle: Settle) -> None:
    message = load("v2-message-stale-running.json")["data"][0]
    document = await settled(settle, f"{V2_VIEW}/{message['id']}", orjson.dumps({"data": message}))
    assert document["data"]["content"][0]["state"]["status"] == "error"


async def test_active_session_passes_byte_for_byte(settle: Settle, fake: FakeOpencode) -> None:
    original = raw("v2-message-busy-running.json")
    busy = next(iter(load("v2-active-busy.json")["data"]))
    fake.v2_active.add(busy)
    body, headers = await sent(settle, f"/api/session/{busy}/message", original)
    assert body == original
    assert SETTLED_HEADER not in headers


async def test_v1_liveness_is_asked_in_the_sessions_directory(settle: Settle, fake: FakeOpencode) -> None:
    """Busy in its own directory: asked in the server's default one, it would look idle."""
    original = compact("v1-message-stale-running.json")
    fake.directories[V1] = "/elsewhere"
    fake.v1_busy["/elsewhere"] = {V1}
    assert (await sent(settle, V1_VIEW, original))[0] == original
    fake.v1_busy["/elsewhere"] = set()
    document = await settled(settle, V1_VIEW, original)
    assert document[1]["parts"][1]["state"]["status"] == "error"


async def test_body_without_open_status_needs_no_liveness(settle: Settle, fake: FakeOpencode) -> None:
    original = compact("v2-message-interrupted.json")
    assert (await sent(settle, V2_VIEW, original))[0] == original
    assert fake.liveness_requests == 0


@pytest.mark.parametrize(
    "body", [b'{"data": [', b"not json", b'{"data": {"x": 1}}', b'[{"info": 1, "running"}]']
)
async def test_malformed_bodies_pass_untouched(settle: Settle, body: bytes) -> None:
    assert (await sent(settle, V2_VIEW, body + b' "running"'))[0] == body + b' "running"'


async def test_unexpected_message_shape_passes_untouched(settle: Settle) -> None:
    document = load("v2-message-stale-running.json")
    del document["data"][0]["time"]
    original = orjson.dumps(document)
    assert (await sent(settle, V2_VIEW, original))[0] == original


@pytest.mark.parametrize("api", ["v1", "v2"])
async def test_unknown_liveness_means_no_rewrite(settle: Settle, fake: FakeOpencode, api: str) -> None:
    original = compact(f"{api}-message-stale-running.json")
    fake.liveness_fails = True
    body, headers = await sent(settle, V1_VIEW if api == "v1" else V2_VIEW, original)
    assert body == original
    assert SETTLED_HEADER not in headers


async def test_stable_across_fetches(settle: Settle) -> None:
    original = compact("v1-message-stale-running.json")
    first, _ = await sent(settle, V1_VIEW, original)
    second, _ = await sent(settle, V1_VIEW, original)
    assert first == second != original


async def test_v1_session_moved_to_another_directory_is_asked_where_it_is(
    settle: Settle, fake: FakeOpencode
) -> None:
    """The directory the proxy last saw is only a guess: after a move, the old directory's
    instance says idle while the session is busy in its new one."""
    original = compact("v1-message-stale-running.json")
    document = await settled(settle, V1_VIEW, original)
    assert document[1]["parts"][1]["state"]["status"] == "error"
    fake.directories[V1] = "/cwd/.worktrees/feature"
    fake.v1_busy["/cwd/.worktrees/feature"] = {V1}
    body, headers = await sent(settle, V1_VIEW, original)
    assert body == original
    assert SETTLED_HEADER not in headers
    assert [r.query.get("directory") for r in fake.seen if r.path == "/session/status"][-2:] == [
        "/cwd",
        "/cwd/.worktrees/feature",
    ]
