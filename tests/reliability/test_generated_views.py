"""Message views generated from the capture shapes, with random extra fields, unicode, whitespace
and open tools at random places, for sessions live or not: the client gets exactly what the rules
make of each; and a huge list, not worth generating.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rules import Api
from tests.fixtures import load
from tests.reliability.background import Rig
from tests.reliability.bad_input import (
    ACTIVE,
    CAPTURES,
    CASES,
    FUZZ,
    MESSAGE_ROUTES,
    SESSION,
    assert_settled,
    assert_unchanged,
    settled_tools,
    settlement_of,
)
from tests.reliability.raw_upstream import Framing, response

_TEXT = st.text(st.characters(codec="utf-8"), max_size=16)
"""Any text UTF-8 can carry (lone surrogates cannot; orjson rightly refuses them)."""
_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _TEXT,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(_TEXT, children, max_size=3),
    max_leaves=8,
)
_EXTRAS = st.dictionaries(_TEXT.map(lambda key: "x-" + key), _JSON, max_size=3)
_STATUSES = {
    Api.V1: ["pending", "running", "running", "completed", "error"],
    Api.V2: ["streaming", "running", "running", "completed", "error"],
}
"""Open statuses half the time, so that most generated views have something to settle."""


def _templates(api: Api) -> list[dict[str, Any]]:
    """Every message of every capture of `api`: the shapes opencode 1.18.33 really serves."""
    found: list[dict[str, Any]] = []
    for name in CAPTURES:
        document = load(name)
        if api is Api.V1 and name.startswith("v1-message") and isinstance(document, list):
            found += document
        if api is Api.V2 and name.startswith("v2-message") and isinstance(document.get("data"), list):
            found += document["data"]
    return found


TEMPLATES = {api: _templates(api) for api in Api}


def _tools(message: dict[str, Any], api: Api) -> list[dict[str, Any]]:
    items = message["parts"] if api is Api.V1 else message.get("content", [])
    return [item for item in items if item.get("type") == "tool" and isinstance(item.get("state"), dict)]


@st.composite
def _message(draw: st.DrawFn, api: Api, number: int) -> dict[str, Any]:
    """A copy of a captured message with a fresh id, its tools in random states, and extra
    fields and unicode where a newer opencode might put them."""
    with_tools = [template for template in TEMPLATES[api] if _tools(template, api)]
    message: dict[str, Any] = copy.deepcopy(
        draw(st.sampled_from(TEMPLATES[api]) | st.sampled_from(with_tools))
    )
    info = message["info"] if api is Api.V1 else message
    info["id"] = f"msg_fuzz{number:04d}"
    info.update(draw(_EXTRAS))
    if api is Api.V1:
        for index, part in enumerate(message["parts"]):
            part.update(id=f"prt_fuzz{number:04d}_{index}", messageID=info["id"])
    for tool in _tools(message, api):
        tool["state"]["status"] = draw(st.sampled_from(_STATUSES[api]))
        tool["state"].update(draw(_EXTRAS))
        tool.update(draw(_EXTRAS))
        if isinstance(tool["state"].get("input"), dict):
            tool["state"]["input"]["command"] = draw(_TEXT)
    return message


DUMPERS: list[Callable[[Any], bytes]] = [
    orjson.dumps,
    lambda document: orjson.dumps(document, option=orjson.OPT_INDENT_2),
    lambda document: json.dumps(document).encode(),
    lambda document: json.dumps(document, ensure_ascii=False, indent="\t").encode(),
    lambda document: json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode(),
    lambda document: json.dumps(document, indent=1, separators=(" ,", " :  ")).encode(),
]


@st.composite
def _view(draw: st.DrawFn) -> tuple[Api, bool, bytes]:
    api, single = draw(st.sampled_from(list(MESSAGE_ROUTES)))
    count = 1 if single else draw(st.integers(1, 6))
    messages = [draw(_message(api, number)) for number in range(count)]
    if api is Api.V1:
        document: Any = messages[0] if single else messages
    else:
        # A field before `data` may even echo a message: its copy must not be taken for it.
        echo = {"x-echo": copy.deepcopy(draw(st.sampled_from(messages)))} if draw(st.booleans()) else {}
        document = {**echo, "data": messages[0] if single else messages, **draw(_EXTRAS)}
        if not single:
            document["cursor"] = {"previous": draw(_TEXT), "next": draw(_TEXT)}
    padding = draw(st.sampled_from([b"", b" ", b"\n", b"\r\n\t "]))
    return api, single, padding + draw(st.sampled_from(DUMPERS))(document) + padding


@FUZZ
@given(
    view=_view(),
    active=ACTIVE,
    content_type=st.sampled_from(["application/json", "application/json; charset=utf-8"]),
    framing=st.sampled_from(["length", "chunked", "close"]),
)
def test_message_views_settle_exactly(
    rig: Rig, view: tuple[Api, bool, bytes], active: bool, content_type: str, framing: Framing
) -> None:
    api, single, body = view
    rig.answer_with(
        response(200, body, [("Content-Type", content_type)], framing=framing),
        active={SESSION} if active else set(),
    )
    answer = rig.request("GET", MESSAGE_ROUTES[(api, single)])
    settled = settlement_of(body, api, single, active)
    if settled is None:
        assert_unchanged(answer, 200, body)
    else:
        assert_settled(answer, settled)
    CASES["views: settled" if settled else "views: live" if active else "views: nothing open"] += 1


@pytest.mark.slow
def test_huge_message_list_settles_exactly(rig: Rig) -> None:
    """20 000 messages (~30 MB) with 40 orphaned tools at random places."""
    stale, done = (
        load("v2-message-stale-running.json")["data"][0],
        load("v2-message-interrupted.json")["data"][0],
    )
    chosen = set(random.Random(6).sample(range(20_000), 40))
    messages = [
        dict(stale if number in chosen else done, id=f"msg_huge{number:05d}") for number in range(20_000)
    ]
    body = orjson.dumps({"data": messages, "cursor": {}}, option=orjson.OPT_INDENT_2)
    rig.answer_with(response(200, body, [("Content-Type", "application/json")]))
    answer = rig.request("GET", MESSAGE_ROUTES[(Api.V2, False)])
    settled = settlement_of(body, Api.V2, False, active=False)
    assert settled is not None
    assert settled_tools(settled) == 40
    assert_settled(answer, settled)
