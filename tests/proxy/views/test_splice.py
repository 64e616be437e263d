"""Locating each message of a view body in its bytes, and replacing exactly those bytes."""

import json
from typing import Any

import orjson
import pytest

from proxy.views.splice import compact_spans, raw_messages, splice
from rules import Api, Settlement, UnexpectedShape

V1: list[dict[str, Any]] = [
    {"info": {"id": "msg_1", "role": "user"}, "parts": []},
    {
        "info": {"role": "assistant", "id": "msg_2"},
        "parts": [{"id": "prt_1", "state": {"status": "running"}}],
    },
]
V2: dict[str, Any] = {
    "data": [{"id": "msg_1", "content": []}, {"id": "msg_2", "content": [{"state": {"status": "running"}}]}]
}


def settled(message: Any, **changes: Any) -> tuple[Any, Settlement]:
    return message, Settlement(message={**message, **changes}, changes=(), last_alive=0)


@pytest.mark.parametrize(("api", "document"), [(Api.V1, V1), (Api.V2, V2)])
def test_a_compact_list_is_cut_into_its_messages_where_they_lie(api: Api, document: Any) -> None:
    body = orjson.dumps(document)
    scanned, raw = raw_messages(body, api)
    assert scanned is body
    messages = V1 if api is Api.V1 else V2["data"]
    assert [orjson.loads(bytes(message)) for message in raw] == messages
    starts = compact_spans(body, raw)
    assert starts is not None
    assert [body[start : start + len(message)] for start, message in zip(starts, raw, strict=True)] == [
        bytes(message) for message in raw
    ]


def test_a_list_not_laid_out_compactly_has_no_compact_spans() -> None:
    body = json.dumps(V1, separators=(", ", ":")).encode()
    _, raw = raw_messages(body, Api.V1)
    assert compact_spans(body, raw) is None
    assert compact_spans(b"[]", []) == []


def test_a_single_message_echoed_before_the_list_has_no_compact_span() -> None:
    body = orjson.dumps({"x-echo": V2["data"][1], "data": [V2["data"][1]]})
    _, raw = raw_messages(body, Api.V2)
    assert compact_spans(body, raw) is None


def test_lone_surrogates_are_neutralized_at_the_same_offsets() -> None:
    body = b'[{"info":{"id":"msg_1","cut":"\\ud83d"},"parts":[]}]'
    scanned, raw = raw_messages(body, Api.V1)
    assert scanned != body
    assert len(scanned) == len(body)
    assert compact_spans(scanned, raw) == [1]


@pytest.mark.parametrize("body", [b'[{"info":', b'{"data": 1}', b'[{"info":{}}, "\xff"]'])
def test_what_is_not_a_message_list_is_an_unexpected_shape(body: bytes) -> None:
    with pytest.raises(UnexpectedShape):
        raw_messages(body, Api.V1 if body.startswith(b"[") else Api.V2)


def test_a_settled_message_replaces_exactly_its_bytes_in_any_layout() -> None:
    body = json.dumps(V1, indent=2).encode()
    spliced = splice(body, [settled(V1[1], settled=True)], Api.V1)
    assert spliced is not None
    assert spliced.startswith(body[: body.index(b'{\n    "info": {\n      "role"')])
    assert json.loads(spliced) == [V1[0], {**V1[1], "settled": True}]


def test_v2_messages_are_found_by_the_id_at_their_top() -> None:
    body = orjson.dumps(V2)
    spliced = splice(body, [settled(V2["data"][0], seen=1), settled(V2["data"][1], seen=2)], Api.V2)
    assert spliced is not None
    assert orjson.loads(spliced)["data"] == [{**V2["data"][0], "seen": 1}, {**V2["data"][1], "seen": 2}]


def test_a_message_echoed_elsewhere_in_the_body_is_not_spliced() -> None:
    """Two identical values: which one is the message cannot be proven, so nothing is changed."""
    body = orjson.dumps({"x-echo": V2["data"][1], **V2})
    assert splice(body, [settled(V2["data"][1], seen=True)], Api.V2) is None


def test_a_message_whose_bytes_differ_from_the_one_settled_is_not_spliced() -> None:
    body = orjson.dumps(V1)
    assert splice(body, [settled({**V1[1], "parts": []}, seen=True)], Api.V1) is None
