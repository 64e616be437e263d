"""The events of the followed stream (1.18's `/global/event`, 2.x's `/api/event`) as the proxy
reads them: line by line, each line only up to a limit, and what a plain event says about its
session's liveness.

aiohttp's own `readline` gives up on a line past its buffer limit (512 KiB) with `LineTooLong`,
having consumed an unknown part of it, so the stream cannot be read on; `readuntil` with a
`max_size` does the same, even for a line whose end it has already consumed. Here the bytes
are read in pieces and cut at line ends by hand: a line longer than the limit is read past,
its bytes dropped as they come, so one huge event costs neither the stream nor more memory
than the limit (and one piece).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from proxy.opencode import jsonio
from proxy.opencode.sessions import SessionEvent, SessionIdle, Transition, transitions

PIECE = 2**16


class UnreadableEvent(ValueError):
    """A `data:` line the proxy cannot read as JSON (for the log: why)."""


@dataclass(frozen=True, slots=True)
class FollowedEvent:
    """One plain event of the followed stream: of `/global/event`, `{"directory", "project"?,
    "payload": {type, properties}}`; or of 2.x's `/api/event` (`line_2x`): `{"id", "type", "data",
    "location"?: {"directory"}, …}`, its `data` as the properties."""

    directory: str | None
    project: str | None
    kind: str
    properties: dict[str, Any]
    line_2x: bool = False
    id: str | None = None
    """The server's id of the event (ids ascend with creation in one server); None if it has none."""
    durable: bool = False
    """2.x: the server stored it in the session's durable log (`durable: {aggregateID, seq, …}`), so
    its view and log already say it to any client that reads them."""
    seq: int | None = None
    """2.x: its `durable.seq` in its session's log (the cursor a catch-up reads after), if durable."""
    _transitions: tuple[Transition, ...] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def session_id(self) -> str | None:
        session = self.properties.get("sessionID")
        return session if isinstance(session, str) else None

    @property
    def transitions(self) -> tuple[Transition, ...]:
        """What the event changes in its session (:mod:`proxy.opencode.sessions`), decoded when the
        follower first asks, so that every listener after it is handed the same, decoded once."""
        if (found := self._transitions) is None:
            found = transitions(self)
            object.__setattr__(self, "_transitions", found)
        return found

    @property
    def turn_over(self) -> bool:
        """Whether the event says its session's turn is over (a status unknown here does not)."""
        return any(isinstance(change, SessionIdle) for change in self.transitions)


async def event_lines(
    content: aiohttp.StreamReader, limit: int, *, silence: float
) -> AsyncIterator[bytes | None]:
    """Each line of `content` (line end included), or None for one longer than `limit` bytes,
    until the stream ends; a last line without its line end is dropped, as an event is only
    whole once it ended. A wait of more than `silence` seconds for the next piece raises
    `TimeoutError`."""
    pending, skipping, searched = bytearray(), False, 0
    while True:
        start = 0
        while (end := pending.find(b"\n", searched)) >= 0:
            too_long = skipping or end + 1 - start > limit
            yield None if too_long else bytes(pending[start : end + 1])
            start = searched = end + 1
            skipping = False
        del pending[:start]
        if len(pending) > limit:
            skipping = True
            pending.clear()
        searched = len(pending)
        async with asyncio.timeout(silence):
            piece = await content.read(PIECE)
        if not piece:
            return
        pending += piece


def read_event(
    data: bytes, parse: Callable[[bytes], FollowedEvent | None] | None = None
) -> FollowedEvent | UnreadableEvent | None:
    """`parse` (default `parse_event`), with what it refuses as a value (the stream reads on)."""
    try:
        return (parse or parse_event)(data)
    except UnreadableEvent as error:
        return error


def parse_event(data: bytes) -> FollowedEvent | None:
    """One `/global/event` payload, or None for what is not a plain event (sync forms); raises
    `UnreadableEvent` for what the decoder refuses, whatever it raises (nested too deep, say)."""
    envelope = load_frame(data)
    payload = envelope.get("payload")
    if not isinstance(payload, dict):
        return None
    kind, properties = payload.get("type"), payload.get("properties")
    if not isinstance(kind, str) or not isinstance(properties, dict):
        return None
    directory, project, event_id = envelope.get("directory"), envelope.get("project"), payload.get("id")
    return FollowedEvent(
        directory if isinstance(directory, str) else None,
        project if isinstance(project, str) else None,
        kind,
        properties,
        id=event_id if isinstance(event_id, str) else None,
    )


def parse_api_event(data: bytes) -> FollowedEvent | None:
    """One `/api/event` frame of 2.x, as `parse_event` reads one of `/global/event`."""
    return api_frame_event(load_frame(data))


def api_frame_event(envelope: dict[str, Any]) -> FollowedEvent | None:
    """A 2.x frame already read as JSON (the durable log reads its marker from the same object)."""
    kind, properties = envelope.get("type"), envelope.get("data")
    if not isinstance(kind, str) or not isinstance(properties, dict):
        return None
    location = envelope.get("location")
    directory = location.get("directory") if isinstance(location, dict) else None
    durable = envelope.get("durable")
    where = directory if isinstance(directory, str) else None
    seq = _seq(durable, properties.get("sessionID")) if isinstance(durable, dict) else None
    return FollowedEvent(
        where, None, kind, properties, line_2x=True, durable=isinstance(durable, dict), seq=seq
    )


def _seq(durable: dict[str, Any], session_id: Any) -> int | None:
    """The `seq` of an event in its session's log (`aggregateID` is the session), if it names one."""
    seq = durable.get("seq")
    fine = isinstance(seq, int) and not isinstance(seq, bool) and durable.get("aggregateID") == session_id
    return seq if fine else None


def load_frame(data: bytes) -> dict[str, Any]:
    """`data` as a JSON object (anything else: an empty one); raises `UnreadableEvent` for what the
    decoder refuses, whatever it raises (nested too deep, say)."""
    try:
        envelope = jsonio.loads(data)
    except orjson.JSONDecodeError:
        raise UnreadableEvent("not JSON") from None
    except Exception as error:  # the fallback decoder: RecursionError past 1,000 levels, and the like
        raise UnreadableEvent(type(error).__name__) from None
    return envelope if isinstance(envelope, dict) else {}


PARSERS = {"/global/event": parse_event, "/api/event": parse_api_event}
"""The streams the proxy reads, each with the reader of its frames."""


def liveness_meaning(event: FollowedEvent) -> SessionEvent | None:
    """What an event says about its session's liveness, if anything."""
    return next((change for change in event.transitions if isinstance(change, SessionEvent)), None)
