"""The contract every consistency rule follows."""

from __future__ import annotations

from typing import ClassVar, Protocol

from rules.changes import Change
from rules.liveness import Liveness
from rules.models import Message


class Rule(Protocol):
    """A pure check of one message against the session's liveness.

    `name` is stable: it appears in logs, response headers and metrics. A rule returns the
    changes it wants (empty when the message is consistent) and never performs I/O.
    """

    name: ClassVar[str]

    def __call__(self, message: Message, liveness: Liveness) -> list[Change]: ...
