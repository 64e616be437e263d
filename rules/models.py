"""Typed, read-only views of the opencode message shapes the rules inspect.

Every model allows extra fields: opencode adds fields between releases, and a rule must
never lose what it does not know. The views are only read; changes are expressed as merge
patches against the original JSON (see :mod:`rules.changes`), so key order and unknown
fields survive byte-for-byte in meaning.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict

JSONObject = dict[str, Any]


class Api(StrEnum):
    """The two opencode runtimes; they keep separate stores and separate liveness."""

    V1 = "v1"
    V2 = "v2"


class _View(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


class V1Time(_View):
    start: int | None = None
    end: int | None = None


class V1ToolState(_View):
    status: str
    time: V1Time | None = None


class V1Part(_View):
    id: str
    type: str
    state: V1ToolState | None = None
    time: V1Time | None = None


class V1MessageTime(_View):
    created: int
    completed: int | None = None


class V1MessageInfo(_View):
    id: str
    role: str
    time: V1MessageTime
    error: JSONObject | None = None


class V1Message(_View):
    """One item of `GET /session/{id}/message`: `{"info": {...}, "parts": [...]}`."""

    info: V1MessageInfo
    parts: list[V1Part]


class V2ToolTime(_View):
    created: int | None = None
    ran: int | None = None
    completed: int | None = None


class V2ToolState(_View):
    status: str


class V2ContentItem(_View):
    type: str
    id: str | None = None
    state: V2ToolState | None = None
    time: V2ToolTime | None = None


class V2MessageTime(_View):
    created: int
    completed: int | None = None


class V2Message(_View):
    """One item of `GET /api/session/{id}/message`'s `data`: a message with `content`."""

    id: str
    type: str
    time: V2MessageTime
    content: list[V2ContentItem] = []


Message = V1Message | V2Message
