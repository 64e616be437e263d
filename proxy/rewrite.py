"""Rewrite a message-view body: run the rules and splice only the changed messages in.

Clients fetch long histories; re-serializing a whole body to change one message would cost
time and would reformat bytes no rule touched. Each changed message is located in the
original bytes and replaced there; the location is verified before it is trusted, and when
it cannot be proven the whole document is re-serialized instead (same meaning, new bytes).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.routes import MessageRoute
from rules import (
    DEFAULT_RULES,
    OPEN_STATUSES,
    Api,
    Liveness,
    Rule,
    Settlement,
    UnexpectedShape,
    ViewSettlement,
    messages_of,
    settle_view,
)

_NEEDLES = {
    api: tuple(b'"' + status.encode() + b'"' for status in statuses)
    for api, statuses in OPEN_STATUSES.items()
}
_DECODER = json.JSONDecoder()


@dataclass(frozen=True, slots=True)
class Rewritten:
    """A rewritten body and the settlement that went into it."""

    body: bytes
    view: ViewSettlement
    spliced: bool
    """False when the changed messages could not be located and the body was re-serialized."""


def mentions_open_status(body: bytes, api: Api) -> bool:
    """A byte scan that rules out most bodies before any parse or liveness look-up."""
    return any(needle in body for needle in _NEEDLES[api])


def rewrite(
    body: bytes, route: MessageRoute, liveness: Liveness, rules: Sequence[Rule] = DEFAULT_RULES
) -> Rewritten | None:
    """Return the settled body, or None when no rule changes anything.

    Raises `UnexpectedShape` for a body that is not JSON of the route's shape.
    """
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise UnexpectedShape(f"body is not JSON: {error}") from error
    originals = messages_of(document, route.api, single=route.single)
    view = settle_view(document, route.api, liveness, single=route.single, rules=rules)
    if view is None:
        return None
    changed = [(originals[index], found) for index, found in view.settled]
    spliced = _splice(body, changed, route.api)
    if spliced is not None:
        return Rewritten(spliced, view, spliced=True)
    return Rewritten(orjson.dumps(view.document), view, spliced=False)


def _splice(body: bytes, changed: list[tuple[Any, Settlement]], api: Api) -> bytes | None:
    spans = []
    for original, found in changed:
        span = _locate(body, original, api)
        if span is None:
            return None
        spans.append((span, orjson.dumps(found.message)))
    pieces, cursor = [], 0
    for (start, end), replacement in sorted(spans):
        pieces += [body[cursor:start], replacement]
        cursor = end
    pieces.append(body[cursor:])
    return b"".join(pieces)


def _locate(body: bytes, message: Any, api: Api) -> tuple[int, int] | None:
    """Find the byte span of `message` in `body`, proven by comparing what is there."""
    compact = orjson.dumps(message)
    for start in _candidate_starts(body, message, api):
        if body.startswith(compact, start):
            return start, start + len(compact)
        end = _decoded_end(body, start, message)
        if end is not None:
            return start, end
    return None


def _candidate_starts(body: bytes, message: Any, api: Api) -> Iterator[int]:
    """Where the message may begin: found from its id, which only a JSON key can precede.

    A quote inside a JSON string is always escaped, so `"id":"msg_…"` cannot match inside
    text. A v2 message opens right before its id; a v1 message at the `{"info":` before its
    id, wherever `id` sits among the info keys (paged v1 lists order them differently).
    """
    identifier = message["info"]["id"] if api is Api.V1 else message["id"]
    for found in re.finditer(rb'"id"\s*:\s*' + re.escape(orjson.dumps(identifier)), body):
        key = found.start() if api is Api.V2 else body.rfind(b'"info"', 0, found.start())
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
