"""JSON in and out: what JavaScript writes for a lone surrogate is read, and written back as it was."""

import json

import orjson
import pytest

from proxy.opencode import jsonio

CUT_EMOJI = b'{"output":"hi \\ud83d"}'
"""`JSON.stringify({output: "hi 😀".slice(0, 4)})`: the string ends inside the emoji."""


def test_lone_surrogate_is_read_and_written_back_as_its_escape() -> None:
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(CUT_EMOJI)
    value = jsonio.loads(CUT_EMOJI)
    assert value == {"output": "hi \ud83d"}
    assert jsonio.dumps(value) == CUT_EMOJI
    assert jsonio.loads(CUT_EMOJI.decode()) == value


@pytest.mark.parametrize(
    ("body", "text"),
    [
        (b'"\\ud83d\\ude00"', "😀"),
        (b'"\\\\ud83d"', "\\ud83d"),
        (b'"\\ude00\\ud83d"', "\ude00\ud83d"),
        (b'"\\ud83d\\\\ude00"', "\ud83d\\ude00"),
        (b'"\\ud83d\\ud83d\\ude00"', "\ud83d😀"),
        (b'"\xf0\x9f\x98\x80 \\ud83d \xc3\xa9"', "😀 \ud83d é"),
    ],
)
def test_pairs_and_escaped_backslashes_survive(body: bytes, text: str) -> None:
    assert jsonio.loads(body) == text
    assert json.loads(jsonio.dumps(text)) == text
    assert jsonio.loads(jsonio.dumps(text)) == text


def test_without_surrogates_it_is_orjson() -> None:
    value = {"a": ["é", "😀", 1.5, None, "\\u", "\n\x00"]}
    assert jsonio.dumps(value) == orjson.dumps(value)


@pytest.mark.parametrize("body", [b"NaN", b"[Infinity]", b'"\\ud83d', b'"\xff"', b'{"a":1,}'])
def test_what_is_not_json_stays_refused(body: bytes) -> None:
    with pytest.raises(orjson.JSONDecodeError):
        jsonio.loads(body)


def test_what_json_cannot_carry_stays_refused() -> None:
    with pytest.raises(orjson.JSONEncodeError):
        jsonio.dumps({"a": float("nan"), "b": "\ud83d"})
    with pytest.raises(orjson.JSONEncodeError):
        jsonio.dumps({"a": object(), "b": "\ud83d"})


@pytest.mark.parametrize(
    ("body", "lone"),
    [
        (b'["\\ud83d"]', [(2, 8)]),
        (b'["\\ud83d\\ude00"]', []),
        (b'["\\uD83D\\uDE00 \\uDE00"]', [(15, 21)]),
        (b'["\\\\ud83d", "\\\\\\ud83d"]', [(15, 21)]),
        (b'["\\ud83d\\ud83d\\ude00x"]', [(2, 8)]),
        (b'["\\ude00\\ud83d"]', [(2, 8), (8, 14)]),
    ],
)
def test_lone_surrogate_escapes_are_found_exactly(body: bytes, lone: list[tuple[int, int]]) -> None:
    assert jsonio.lone_surrogates(body) == lone
    neutral = jsonio.without_lone_surrogates(body)
    assert len(neutral) == len(body)
    orjson.loads(neutral)
