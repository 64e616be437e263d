"""The two signs the built-in rules look for: an open tool, and an unfinished assistant message.

Each is found in bytes the way opencode 1.18.33 lays a view out (compact JSON), and again on a
parsed message (`rules.tools`). What each runtime's bytes look like is data here, keyed by
`Api`; the search is one. A quote inside a JSON string is always escaped, so text cannot match.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from rules.models import Api
from rules.runtimes import RUNTIMES
from rules.tools import has_open_tool, is_unfinished_assistant

__all__ = [
    "OPEN_TOOL_TRIGGER",
    "UNFINISHED_ASSISTANT_TRIGGER",
    "OpenToolTrigger",
    "UnfinishedAssistantTrigger",
]

_CREATED = b'"time":{"created":'
_MAX_DIGITS = 20


class OpenToolTrigger:
    """A tool item in one of its runtime's open statuses (`"running"`…, quoted)."""

    def __init__(self) -> None:
        self._needles = {
            api: tuple(b'"' + status.encode() + b'"' for status in sorted(runtime.open_statuses))
            for api, runtime in RUNTIMES.items()
        }

    def positions(self, body: bytes, api: Api) -> Iterator[int]:
        for needle in self._needles[api]:
            position = body.find(needle)
            while position >= 0:
                yield position
                position = body.find(needle, position + len(needle))

    def matches(self, raw_message: Any, api: Api) -> bool:
        return has_open_tool(raw_message, api)


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
class _Unfinished:
    """How a runtime's assistant message without `time.completed` looks in bytes."""

    anchor: bytes
    """The compact anchor of an assistant message's `time` (v1 info `"role":"assistant","time":
    {"created":N},…`, v2 `{"id":…,"time":{"created":N},"type":"assistant",…}`)."""
    created_only: Callable[[bytes, int, bytes], bool]
    spaced: re.Pattern[bytes]
    """The same with any JSON whitespace, for bodies laid out otherwise (slower)."""


_UNFINISHED = {
    Api.V1: _Unfinished(
        b'"role":"assistant",' + _CREATED,
        _opens_created_only,
        re.compile(rb'"role"\s*:\s*"assistant"\s*,\s*"time"\s*:\s*\{\s*"created"\s*:\s*\d+\s*\}'),
    ),
    Api.V2: _Unfinished(
        b'},"type":"assistant"',
        _closes_created_only,
        re.compile(rb'"time"\s*:\s*\{\s*"created"\s*:\s*\d+\s*\}\s*,\s*"type"\s*:\s*"assistant"'),
    ),
}


class UnfinishedAssistantTrigger:
    """An assistant message whose `time` holds `created` and nothing else (a turn cut while the
    model was writing has no tool to find)."""

    def positions(self, body: bytes, api: Api) -> Iterator[int]:
        """When no assistant message is found in the compact layout but one is named, the body is
        laid out otherwise (spaced, pretty-printed) and the slower pattern that allows whitespace
        is tried. Another key order is missed, which only leaves such a message as the server
        shows it."""
        shape = _UNFINISHED[api]
        position = body.find(shape.anchor)
        if position < 0:
            if b'"assistant"' in body:
                yield from (found.start() for found in shape.spaced.finditer(body))
            return
        while position >= 0:
            if shape.created_only(body, position, shape.anchor):
                yield position
            position = body.find(shape.anchor, position + len(shape.anchor))

    def matches(self, raw_message: Any, api: Api) -> bool:
        return is_unfinished_assistant(raw_message, api)


OPEN_TOOL_TRIGGER = OpenToolTrigger()
UNFINISHED_ASSISTANT_TRIGGER = UnfinishedAssistantTrigger()
