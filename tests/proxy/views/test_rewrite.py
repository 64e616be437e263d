"""The body splicer: only changed messages get new bytes, and only where that is proven safe."""

import json
from typing import Any

import orjson
import pytest

from proxy.opencode.routes import MessageRoute, match_message_route
from proxy.views.rewrite import rewrite
from proxy.views.scan import trigger_offsets
from rules import Api, Liveness, UnexpectedShape, settle
from tests.fixtures import js_json, load

INACTIVE = Liveness("ses_x", active=False)
V2_LIST = MessageRoute(Api.V2, "ses_x", single=False)
V1_LIST = MessageRoute(Api.V1, "ses_x", single=False)


def v2_history(stale_at: set[int], size: int = 6) -> dict[str, Any]:
    """A v2 list of `size` assistant messages with the ones at `stale_at` still running."""
    template = load("v2-message-stale-running.json")["data"][0]
    messages = []
    for index in range(size):
        message = json.loads(json.dumps(template))
        message["id"] = f"msg_{index:04d}"
        message["content"][0]["id"] = f"call_{index}"
        message["content"][0]["state"]["input"]["description"] = f"héllo ✓ {index}"
        if index not in stale_at:
            message["content"][0]["state"]["status"] = "completed"
            message["time"]["completed"] = 1
        messages.append(message)
    return {"data": messages, "cursor": {"previous": None, "next": None}}


def expected(document: dict[str, Any], stale_at: set[int]) -> dict[str, Any]:
    data = [
        settled.message if (settled := settle(m, Api.V2, INACTIVE)) and i in stale_at else m
        for i, m in enumerate(document["data"])
    ]
    return {**document, "data": data}


@pytest.mark.parametrize("stale_at", [{0}, {5}, {1, 3, 4}])
@pytest.mark.parametrize("indent", [None, 2])
def test_changed_messages_are_spliced_into_the_original_bytes(stale_at: set[int], indent: int | None) -> None:
    document = v2_history(stale_at)
    body = json.dumps(document, indent=indent, ensure_ascii=False).encode()
    result = rewrite(body, V2_LIST, INACTIVE)
    assert result is not None
    assert result.spliced
    assert orjson.loads(result.body) == expected(document, stale_at)
    assert result.messages.settled_parts == len(stale_at)
    untouched = json.dumps(document["data"][2], indent=indent, ensure_ascii=False).encode()
    if 2 not in stale_at and indent is None:
        assert untouched in result.body


def test_key_order_does_not_matter_in_a_compact_list() -> None:
    document = v2_history({1})
    document["data"][1] = {"type": document["data"][1].pop("type"), **document["data"][1]}
    body = orjson.dumps(document)
    result = rewrite(body, V2_LIST, INACTIVE)
    assert result is not None
    assert result.spliced
    assert orjson.loads(result.body) == expected(document, {1})


def test_a_large_compact_list_is_settled_without_parsing_every_message() -> None:
    document = v2_history({2}, size=3000)
    body = orjson.dumps(document)
    result = rewrite(body, V2_LIST, INACTIVE)
    assert result is not None
    assert result.spliced
    assert [index for index, _ in result.messages.settled] == [2]
    untouched = orjson.dumps(document["data"][3:])[1:-1]
    assert untouched in result.body


def test_unprovable_location_falls_back_to_a_full_dump() -> None:
    document = v2_history({1})
    document["data"][1] = {
        "type": document["data"][1].pop("type"),
        **document["data"][1],
    }  # id no longer first
    result = rewrite(json.dumps(document, indent=1).encode(), V2_LIST, INACTIVE)
    assert result is not None
    assert not result.spliced
    assert orjson.loads(result.body) == expected(document, {1})


def test_nothing_to_change_returns_none() -> None:
    assert rewrite(orjson.dumps(v2_history(set())), V2_LIST, INACTIVE) is None
    assert rewrite(orjson.dumps(v2_history({2})), V2_LIST, Liveness("ses_x", active=True)) is None


def test_v1_list_splices_the_last_message() -> None:
    messages = load("v1-message-stale-running.json")
    body = orjson.dumps(messages)
    result = rewrite(body, V1_LIST, INACTIVE)
    assert result is not None
    assert result.spliced
    assert result.body.startswith(b"[" + orjson.dumps(messages[0]) + b",")
    assert orjson.loads(result.body)[1]["parts"][1]["state"]["status"] == "error"


@pytest.mark.parametrize("indent", [None, 2])
@pytest.mark.parametrize("where", [{1}, {2}, {1, 2}])
def test_a_lone_surrogate_anywhere_in_a_v2_list_is_kept_and_the_list_settled(
    where: set[int], indent: int | None
) -> None:
    document = v2_history({1, 4})
    for index in where:
        document["data"][index]["content"][0]["state"]["input"]["description"] = "cut \ud83d 😀 \\ud83d"
    body = js_json(document, indent)
    result = rewrite(body, V2_LIST, INACTIVE)
    assert result is not None
    assert result.spliced
    assert json.loads(result.body) == expected(json.loads(body), {1, 4})
    assert result.body.count(b"cut \\ud83d \xf0\x9f\x98\x80 \\\\ud83d") == len(where)
    if indent is None:
        assert js_json(document["data"][2]) in result.body


def test_a_lone_surrogate_in_a_v1_list_and_single_message() -> None:
    messages = load("v1-message-stale-running.json")
    messages[0]["parts"][0]["text"] = "\udc00 left"
    messages[1]["parts"][1]["state"]["metadata"]["output"] = "hello \ud83d"
    body = js_json(messages)
    result = rewrite(body, V1_LIST, INACTIVE)
    assert result is not None
    assert result.spliced
    assert result.body.startswith(b"[" + js_json(messages[0]) + b",")
    assert b'"output":"hello \\ud83d"' in result.body
    assert json.loads(result.body)[1]["parts"][1]["state"]["status"] == "error"
    single = rewrite(js_json(messages[1]), MessageRoute(Api.V1, "ses_x", single=True), INACTIVE)
    assert single is not None
    assert b'"output":"hello \\ud83d"' in single.body


@pytest.mark.parametrize(
    ("body", "route"),
    [
        (b"[]", MessageRoute(Api.V2, "s", single=False)),
        (b"{}", V1_LIST),
        (b"[1", V1_LIST),
        (b"\xff", V1_LIST),
    ],
)
def test_wrong_shapes_are_refused(body: bytes, route: MessageRoute) -> None:
    with pytest.raises(UnexpectedShape):
        rewrite(body, route, INACTIVE)


V1_CUT_WHILE_WRITING = (
    b'[{"info":{"id":"msg_22d9be467001tQAkqTA0iYbwH0","sessionID":"ses_dd2641ef7ffe7sQ2Z7d3erYsJI","role":"user",'
    b'"time":{"created":1796061520999},"summary":{"diffs":[]},"agent":"build","model":{"providerID":"mock",'
    b'"modelID":"m"}},"parts":[{"id":"prt_22d9be474001zWSiKyQaesPBao","sessionID":"ses_dd2641ef7ffe7sQ2Z7d3erYsJI",'
    b'"messageID":"msg_22d9be467001tQAkqTA0iYbwH0","type":"text","text":"slow v1"}]},{"info":{"id":'
    b'"msg_22d9bfceb001RuBcIxxvH5Mpww","sessionID":"ses_dd2641ef7ffe7sQ2Z7d3erYsJI","role":"assistant",'
    b'"time":{"created":1796061527275},"parentID":"msg_22d9be467001tQAkqTA0iYbwH0","modelID":"m",'
    b'"providerID":"mock","mode":"build","agent":"build","path":{"cwd":"/tmp/p","root":"/"},"cost":0,'
    b'"tokens":{"input":0,"output":0,"reasoning":0,"cache":{"read":0,"write":0}}},"parts":[]}]'
)
V2_CUT_WHILE_WRITING = (
    b'{"data":[{"id":"msg_22d9bfcc5001uZP4M4E4Np4wIL","time":{"created":1796061527237},"type":"assistant",'
    b'"agent":"build","model":{"id":"m","providerID":"mock","variant":"default"},"content":[{"type":"text",'
    b'"id":"text-0","text":""}]},{"id":"msg_22d9be30f001n044oF1Bcjkt5F","time":{"created":1796061520667},'
    b'"text":"slow v2","type":"user"}],"cursor":{"previous":"eyJp","next":"eyJp"}}'
)
"""Views served by opencode 1.18.33 after a SIGKILL while the model was still writing (no tool
called yet): the assistant message has no `time.completed` (paths and cursors shortened)."""


@pytest.mark.parametrize(
    ("body", "route", "created"),
    [
        (V1_CUT_WHILE_WRITING, V1_LIST, b"1796061527275"),
        (V2_CUT_WHILE_WRITING, V2_LIST, b"1796061527237"),
    ],
    ids=["v1", "v2"],
)
def test_an_assistant_message_cut_before_any_tool_is_found_and_closed(
    body: bytes, route: MessageRoute, created: bytes
) -> None:
    assert trigger_offsets(body, route.api)
    result = rewrite(body, route, INACTIVE)
    assert result is not None
    assert result.spliced
    messages = orjson.loads(result.body)
    closed = messages[1]["info"] if route.api is Api.V1 else messages["data"][0]
    assert closed["time"] == {"created": int(created), "completed": int(created)}
    finished = body.replace(b'"created":' + created + b"}", b'"created":' + created + b',"completed":1}')
    assert not trigger_offsets(finished, route.api)
    assert rewrite(finished, route, INACTIVE) is None


def test_byte_scan() -> None:
    assert trigger_offsets(b'{"status":"streaming"}', Api.V2)
    assert not trigger_offsets(b'{"status":"pending"}', Api.V2)
    assert trigger_offsets(b'{"status":"pending"}', Api.V1)
    assert not trigger_offsets(b'{"status":"completed"}', Api.V1)


@pytest.mark.parametrize(
    ("method", "path", "route"),
    [
        ("GET", "/api/session/ses_1/message", MessageRoute(Api.V2, "ses_1", single=False)),
        ("GET", "/api/session/ses_1/message/msg_2", MessageRoute(Api.V2, "ses_1", single=True)),
        ("GET", "/session/ses_1/message", MessageRoute(Api.V1, "ses_1", single=False)),
        ("GET", "/session/ses_1/message/msg_2/", MessageRoute(Api.V1, "ses_1", single=True)),
        ("POST", "/session/ses_1/message", None),
        ("GET", "/session/ses_1/message/msg_2/part/prt_3", None),
        ("GET", "/session/status", None),
        ("GET", "/api/session/ses_1/event", None),
    ],
)
def test_message_routes(method: str, path: str, route: MessageRoute | None) -> None:
    assert match_message_route(method, path) == route


def test_v1_paged_key_order_still_splices() -> None:
    messages = load("v1-message-stale-running.json")
    info = messages[1]["info"]
    messages[1]["info"] = {
        key: info[key] for key in [*(k for k in info if k not in ("id", "sessionID")), "id", "sessionID"]
    }
    result = rewrite(orjson.dumps(messages), V1_LIST, INACTIVE)
    assert result is not None
    assert result.spliced
    settled = orjson.loads(result.body)[1]
    assert list(settled["info"])[-3:] == ["id", "sessionID", "error"]


def test_v2_context_view_is_a_message_list() -> None:
    assert match_message_route("GET", "/api/session/ses_1/context") == MessageRoute(
        Api.V2, "ses_1", single=False
    )
    document = {"data": v2_history({0})["data"]}
    result = rewrite(orjson.dumps(document), MessageRoute(Api.V2, "ses_1", single=False), INACTIVE)
    assert result is not None
    assert list(orjson.loads(result.body)) == ["data"]


@pytest.mark.parametrize("body", [V1_CUT_WHILE_WRITING, V2_CUT_WHILE_WRITING], ids=["v1", "v2"])
@pytest.mark.parametrize("indent", [None, 2])
def test_an_unfinished_message_is_found_in_a_spaced_layout_too(body: bytes, indent: int | None) -> None:
    api = Api.V1 if body.startswith(b"[") else Api.V2
    spaced = json.dumps(orjson.loads(body), indent=indent).encode()
    assert trigger_offsets(spaced, api)
    finished = spaced.replace(b'"created": 1796061527', b'"completed": 1, "created": 1796061527')
    assert not trigger_offsets(finished, api)
