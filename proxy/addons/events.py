"""Events in opencode's own shape, framed as opencode frames its own, for the addons that speak
on client event streams (the relay only slips the frames in)."""

from __future__ import annotations

from collections.abc import Mapping

from proxy.opencode import jsonio
from proxy.opencode.ids import ascending_id


def event_frame(envelope: object) -> bytes:
    """One SSE event carrying `envelope` as JSON, framed as opencode frames its own."""
    return b"data: " + jsonio.dumps(envelope) + b"\n\n"


def opencode_event(kind: str, properties: Mapping[str, object]) -> dict[str, object]:
    """An event in opencode's own shape, with an id of its own ascending kind."""
    return {"id": ascending_id("evt"), "type": kind, "properties": dict(properties)}
