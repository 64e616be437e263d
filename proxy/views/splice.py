"""Where each message of a view body lies, so that a settled message replaces exactly its bytes.

A list is cut into its messages without parsing them (msgspec checks the syntax of the whole
body and hands back each top-level message as raw bytes, at about 1 GB/s). When the layout is
not the compact one opencode sends, spans are found from message ids instead, and verified
before they are trusted.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import msgspec

from proxy.opencode import jsonio
from rules import Api, Settlement, UnexpectedShape, runtime_of

_DECODER = json.JSONDecoder()


class _V2List(msgspec.Struct):
    data: list[msgspec.Raw]


_V1_LIST = msgspec.json.Decoder(list[msgspec.Raw])
_V2_LIST = msgspec.json.Decoder(_V2List)
_LISTS: dict[Api, Callable[[bytes], list[msgspec.Raw]]] = {
    Api.V1: _V1_LIST.decode,
    Api.V2: lambda body: _V2_LIST.decode(body).data,
}
"""How a runtime's list view holds its messages: a bare array (v1), or `{"data": [...]}` (v2)."""


def raw_messages(body: bytes, api: Api) -> tuple[bytes, list[msgspec.Raw]]:
    """The list's messages as raw bytes, and the bytes they lie in: `body`, or a copy of it of
    the same length and layout with its lone surrogate escapes (which msgspec refuses)
    neutralized, so that every offset found in it holds for `body` too."""
    try:
        body.decode("utf-8")  # msgspec leaves the strings of skipped values unchecked
        return body, list(_LISTS[api](body))
    except UnicodeDecodeError as error:
        raise UnexpectedShape(f"{api} message list: {error}") from error
    except msgspec.DecodeError as error:
        scanned = jsonio.without_lone_surrogates(body)
        try:
            return scanned, list(_LISTS[api](scanned))
        except msgspec.DecodeError:
            raise UnexpectedShape(f"{api} message list: {error}") from error


def compact_messages(body: bytes, api: Api) -> tuple[list[msgspec.Raw], list[int]] | None:
    """The list's messages as raw bytes and the offset in `body` each starts at, when they sit in
    it as opencode sends them (`compact_spans`); None for another layout."""
    scanned, raw = raw_messages(body, api)
    starts = compact_spans(scanned, raw)
    return None if starts is None else (raw, starts)


def compact_spans(body: bytes, raw: list[msgspec.Raw]) -> list[int] | None:
    """Start offsets of the messages, if they sit in `body` separated by single commas.

    The first message is found by its bytes; the others then follow from the lengths. An extra
    byte anywhere, or a first find that hit an identical value in a field before the list,
    would shift every later message, so finding the last one where the lengths put it proves
    the layout for all of them. A list of one message has no "later" to check, so there its
    bytes must occur only once.
    """
    if not raw:
        return []
    first = body.find(bytes(raw[0]))
    if first < 0 or (len(raw) == 1 and body.find(bytes(raw[0]), first + 1) >= 0):
        return None
    starts = list(itertools.accumulate((len(message) + 1 for message in raw[:-1]), initial=first))
    last = starts[-1]
    return starts if body[last : last + len(raw[-1])] == bytes(raw[-1]) else None


def splice(body: bytes, changed: list[tuple[Any, Settlement]], api: Api) -> bytes | None:
    """`body` with each original message replaced by its settlement, or None when one of them
    cannot be located for certain."""
    spans = []
    for original, settlement in changed:
        span = _locate(body, original, api)
        if span is None:
            return None
        spans.append((span, jsonio.dumps(settlement.message)))
    pieces, cursor = [], 0
    for (start, end), replacement in sorted(spans):
        pieces += [body[cursor:start], replacement]
        cursor = end
    pieces.append(body[cursor:])
    return b"".join(pieces)


def _locate(body: bytes, message: Any, api: Api) -> tuple[int, int] | None:
    """Find the byte span of `message` in `body`, proven by comparing what is there and by
    being the only one: an identical value elsewhere (a field echoing the message) makes it
    unprovable which one is the message."""
    compact = jsonio.dumps(message)
    spans = set()
    for start in _candidate_starts(body, message, api):
        end = start + len(compact) if body.startswith(compact, start) else _decoded_end(body, start, message)
        if end is not None:
            spans.add((start, end))
    return spans.pop() if len(spans) == 1 else None


def _candidate_starts(body: bytes, message: Any, api: Api) -> Iterator[int]:
    """Where the message may begin: found from its id, which only a JSON key can precede.

    A quote inside a JSON string is always escaped, so `"id":"msg_…"` cannot match inside
    text. A message whose id sits at its top (v2) opens right before it; one whose id sits in
    a header object (v1 `info`) opens at the `{"info":` before the id, wherever `id` sits among
    the header's keys (paged v1 lists order them differently).
    """
    runtime = runtime_of(api)
    header = b"".join(b'"' + str(key).encode() + b'"' for key in runtime.header_path[:1])
    identifier = jsonio.dumps(runtime.message_id(message))
    for match in re.finditer(rb'"id"\s*:\s*' + re.escape(identifier), body):
        key = body.rfind(header, 0, match.start()) if header else match.start()
        brace = _previous_non_space(body, key)
        if brace >= 0 and body[brace] == ord("{"):
            yield brace


def _previous_non_space(body: bytes, position: int) -> int:
    """Index of the last byte before `position` that is not JSON whitespace (-1 if none)."""
    index = position - 1
    while index >= 0 and body[index] in b" \t\r\n":
        index -= 1
    return index


def _decoded_end(body: bytes, start: int, message: Any) -> int | None:
    """The end of the JSON value at `start` if it equals `message` (for non-compact bodies)."""
    tail = body[start:].decode("utf-8", errors="strict")
    try:
        value, end = _DECODER.raw_decode(tail)
    except ValueError:
        return None
    return start + len(tail[:end].encode()) if value == message else None
