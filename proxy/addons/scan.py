"""The byte scan that finds which messages of a view body the rules may have to see.

It runs on every body of a message route before anything is parsed, so it only looks for
bytes: an open tool status (`"running"`…), or an assistant message whose `time` holds
`created` and nothing else (a turn cut while the model was writing has no tool to find).
What each runtime's bytes look like is data here, keyed by `Api`; the search is one.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from rules import Api, runtime_of

_CREATED = b'"time":{"created":'
_MAX_DIGITS = 20


def _opens_created_only(body: bytes, position: int, anchor: bytes) -> bool:
    """v1: the anchor ends with `"time":{"created":`; the digits after it must close the object."""
    digits = position + len(anchor)
    end = body.find(b"}", digits, digits + _MAX_DIGITS)
    return end > digits and body[digits:end].isdigit()


def _closes_created_only(body: bytes, position: int, anchor: bytes) -> bool:
    """v2: the anchor starts with the `}` that closes `time`; `created` and digits must precede it."""
    del anchor
    created = body.rfind(_CREATED, max(0, position - _MAX_DIGITS - len(_CREATED)), position)
    return created >= 0 and body[created + len(_CREATED) : position].isdigit()


@dataclass(frozen=True, slots=True)
class _Bytes:
    """How a runtime's message bytes say "open" in the compact layout opencode 1.18.33 sends."""

    needles: tuple[bytes, ...]
    """Its open statuses, quoted."""
    unfinished: bytes
    """The compact anchor of an assistant message's `time` (v1 info `"role":"assistant","time":
    {"created":N},…`, v2 `{"id":…,"time":{"created":N},"type":"assistant",…}`)."""
    created_only: Callable[[bytes, int, bytes], bool]
    spaced: re.Pattern[bytes]
    """The same with any JSON whitespace, for bodies laid out otherwise (slower)."""


def _needles(api: Api) -> tuple[bytes, ...]:
    return tuple(b'"' + status.encode() + b'"' for status in sorted(runtime_of(api).open_statuses))


_BYTES = {
    Api.V1: _Bytes(
        _needles(Api.V1),
        b'"role":"assistant",' + _CREATED,
        _opens_created_only,
        re.compile(rb'"role"\s*:\s*"assistant"\s*,\s*"time"\s*:\s*\{\s*"created"\s*:\s*\d+\s*\}'),
    ),
    Api.V2: _Bytes(
        _needles(Api.V2),
        b'},"type":"assistant"',
        _closes_created_only,
        re.compile(rb'"time"\s*:\s*\{\s*"created"\s*:\s*\d+\s*\}\s*,\s*"type"\s*:\s*"assistant"'),
    ),
}


def mentions_open_status(body: bytes, api: Api) -> bool:
    """A byte scan that rules out most bodies before any parse or liveness look-up: an open
    tool status, or an assistant message without `time.completed`."""
    return any(needle in body for needle in _BYTES[api].needles) or next(unfinished(body, api), -1) >= 0


def unfinished(body: bytes, api: Api) -> Iterator[int]:
    """Positions inside the assistant messages whose `time` holds `created` and nothing else.

    A quote inside a string is escaped, so text cannot match. When no assistant message is
    found in the compact layout but one is named, the body is laid out otherwise (spaced,
    pretty-printed) and the slower pattern that allows whitespace is tried. Another key order
    is missed, which only leaves such a message as the server shows it.
    """
    shape = _BYTES[api]
    position = body.find(shape.unfinished)
    if position < 0:
        if b'"assistant"' in body:
            yield from (found.start() for found in shape.spaced.finditer(body))
        return
    while position >= 0:
        if shape.created_only(body, position, shape.unfinished):
            yield position
        position = body.find(shape.unfinished, position + len(shape.unfinished))


def candidates(body: bytes, starts: list[int], api: Api) -> list[int]:
    """Indexes of the messages (starting at `starts`) in which an open status occurs, or that
    are unfinished, in order."""
    found: set[int] = set()
    for needle in _BYTES[api].needles:
        position = body.find(needle)
        while position >= 0:
            found.add(bisect.bisect_right(starts, position) - 1)
            position = body.find(needle, position + len(needle))
    found.update(bisect.bisect_right(starts, position) - 1 for position in unfinished(body, api))
    return sorted(index for index in found if index >= 0)
