"""Events framed as opencode frames its own, for the addons that speak on client event streams
(the relay only slips the frames in); the events themselves are built by
:mod:`proxy.opencode.vocabulary`."""

from __future__ import annotations

from proxy.opencode import jsonio


def event_frame(envelope: object) -> bytes:
    """One SSE event carrying `envelope` as JSON, framed as opencode frames its own."""
    return b"data: " + jsonio.dumps(envelope) + b"\n\n"
