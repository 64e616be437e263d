"""Any answer at all from the upstream passes unchanged unless a rule applies: arbitrary bytes,
truncated, corrupted or valid captures, under any status, content type, content encoding and
framing, on message routes (GET and HEAD) and elsewhere; and huge bodies, not worth generating.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rules import Api
from tests.fixtures import load, raw
from tests.reliability.background import Rig
from tests.reliability.bad_input import (
    ACTIVE,
    CAPTURES,
    CASES,
    FUZZ,
    MESSAGE_ROUTES,
    PLAIN_ROUTE,
    SESSION,
    assert_settled,
    assert_unchanged,
    settlement_of,
)
from tests.reliability.raw_upstream import Framing, response

_capture_bytes = st.sampled_from(CAPTURES).flatmap(
    lambda name: st.sampled_from([raw(name), orjson.dumps(load(name))])
)


def _corrupted(body: bytes) -> st.SearchStrategy[bytes]:
    flips = st.lists(
        st.tuples(st.integers(0, max(len(body) - 1, 0)), st.integers(0, 255)), min_size=1, max_size=4
    )

    def apply(changes: list[tuple[int, int]]) -> bytes:
        data = bytearray(body)
        for index, value in changes:
            if data:
                data[index] = value
        return bytes(data)

    return flips.map(apply)


BODIES = st.one_of(
    st.binary(max_size=2048),
    _capture_bytes,
    _capture_bytes.flatmap(lambda body: st.integers(0, len(body)).map(lambda cut: body[:cut])),
    _capture_bytes.flatmap(_corrupted),
)


@dataclass(frozen=True)
class Case:
    method: str
    route: tuple[Api, bool] | None
    status: int
    content_type: str | None
    encoding: str | None
    framing: Framing
    body: bytes

    @property
    def path(self) -> str:
        return PLAIN_ROUTE if self.route is None else MESSAGE_ROUTES[self.route]

    def rule_may_apply(self) -> bool:
        """GET of a message view, 200, JSON, and no content coding: these bodies are never really
        compressed, so one labelled gzip, br, … does not decode and must pass as it came."""
        return (
            self.method == "GET"
            and self.route is not None
            and self.status == 200
            and (self.content_type or "").startswith("application/json")
            and (self.encoding or "identity").lower() == "identity"
        )


CASE = st.builds(
    Case,
    method=st.sampled_from(["GET", "GET", "GET", "HEAD"]),
    route=st.sampled_from([None, *MESSAGE_ROUTES]),
    status=st.sampled_from([200, 200, 200, 200, 201, 204, 206, 304, 404, 500]),
    content_type=st.sampled_from(
        [
            "application/json",
            "application/json; charset=utf-8",
            "text/plain",
            "application/octet-stream",
            None,
        ]
    ),
    encoding=st.sampled_from([None, None, "identity", "gzip", "deflate", "br", "zstd"]),
    framing=st.sampled_from(["length", "chunked", "close"]),
    body=BODIES,
)


@FUZZ
@given(case=CASE, active=ACTIVE)
def test_any_answer_passes_unless_a_rule_applies(rig: Rig, case: Case, active: bool) -> None:
    headers = [("Content-Type", case.content_type)] if case.content_type else []
    headers += [("Content-Encoding", case.encoding)] if case.encoding else []
    reply = response(case.status, case.body, headers, framing=case.framing, head=case.method == "HEAD")
    rig.answer_with(reply, active={SESSION} if active else set())
    answer = rig.request(case.method, case.path)
    view = None
    if case.rule_may_apply() and case.route is not None:
        view = settlement_of(case.body, case.route[0], case.route[1], active)
    bodiless = case.method == "HEAD" or case.status in (204, 304)
    if view is None:
        assert_unchanged(answer, case.status, b"" if bodiless else case.body)
    else:
        assert_settled(answer, view)
    for name, value in headers:
        assert answer.headers.get(name.lower()) == value, f"{name} changed"
    if case.framing == "length" and not bodiless and view is None:
        assert answer.headers.get("content-length") == str(len(case.body))
    CASES[
        "any answer: settled" if view else f"any answer: passed ({'HEAD' if bodiless else case.framing})"
    ] += 1


HUGE = 64 * 2**20


@pytest.mark.slow
@pytest.mark.parametrize(
    ("path", "framing"), [(MESSAGE_ROUTES[(Api.V2, False)], "length"), (PLAIN_ROUTE, "chunked")]
)
def test_huge_unparseable_body_passes_unchanged(rig: Rig, path: str, framing: Framing) -> None:
    body = random.Random(6).randbytes(HUGE)
    rig.answer_with(response(200, body, [("Content-Type", "application/json")], framing=framing))
    answer = rig.request("GET", path)
    assert answer.status == 200
    assert hashlib.sha256(answer.body).digest() == hashlib.sha256(body).digest()
