"""JSON in and out for everything the proxy reads from opencode, lone surrogates included.

JavaScript strings are UTF-16, and `JSON.stringify` writes a lone surrogate (a string cut
inside an emoji, common in truncated tool output) as the escape `"\\ud83d"`. Python's `json`
accepts that; orjson and msgspec refuse it, and one such string would make a whole message
list unreadable. So orjson stays the fast path, and only a document it refuses is read again
with `json` (a lone surrogate becomes a lone surrogate code point in the `str`). On the way
out such a `str` cannot be UTF-8, so orjson refuses it too; `json` then writes it and
`backslashreplace` turns each lone surrogate, the only code points UTF-8 cannot carry, back
into the `\\udXXX` escape it came from. A proper pair is one code point by then, and a
backslash is written as `\\\\` before the replacement runs, so neither is mangled.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_HIGH = frozenset(b"89abAB")
_NEUTRAL = b"\\u0020"
"""A space, written as an escape of the same length as the one it stands in for."""


def loads(data: bytes | str) -> Any:
    """Parse a JSON document; raises `orjson.JSONDecodeError` for what is not JSON."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as error:
        try:
            text = data.decode("utf-8") if isinstance(data, bytes) else data
            return json.loads(text, parse_constant=_refuse)
        except ValueError:
            raise error from None


def dumps(value: Any) -> bytes:
    """Compact JSON as orjson writes it, or with lone surrogates as `\\udXXX` escapes."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError as error:
        try:
            text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError):
            raise error from None
        return text.encode("utf-8", "backslashreplace")


def lone_surrogates(body: bytes) -> list[tuple[int, int]]:
    """Spans of the escapes in `body` that stand for a lone surrogate (not half of a pair).

    Only valid for the bytes of a JSON document, where every backslash is inside a string:
    an escape counts only after an even number of backslashes (`\\\\ud83d` is text).
    """
    found = []
    escapes = [match.span() for match in _SURROGATE_ESCAPE.finditer(body) if _escaped_at(body, match.start())]
    index = 0
    while index < len(escapes):
        start, end = escapes[index]
        following = escapes[index + 1] if index + 1 < len(escapes) else None
        paired = following is not None and following[0] == end and body[following[0] + 3] not in _HIGH
        if body[start + 3] in _HIGH and paired:
            index += 2
            continue
        found.append((start, end))
        index += 1
    return found


def without_lone_surrogates(body: bytes) -> bytes:
    """`body` with each lone surrogate escape replaced by an escape of the same length that
    strict decoders accept, so offsets found in the result hold for `body` too."""
    spans = lone_surrogates(body)
    if not spans:
        return body
    pieces, cursor = [], 0
    for start, end in spans:
        pieces += [body[cursor:start], _NEUTRAL]
        cursor = end
    pieces.append(body[cursor:])
    return b"".join(pieces)


def _escaped_at(body: bytes, position: int) -> bool:
    """Whether the backslash at `position` starts an escape (is not itself escaped)."""
    before = position
    while before > 0 and body[before - 1] == ord("\\"):
        before -= 1
    return (position - before) % 2 == 0


def _refuse(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")
