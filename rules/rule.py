"""The contract every consistency rule follows, and the cheap sign that it may apply."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar, Protocol

from rules.changes import Change
from rules.liveness import Liveness
from rules.models import Api, Message


class Trigger(Protocol):
    """What a rule looks for before anything is parsed or validated, at two costs.

    Long histories are mostly settled messages, so whether a rule runs at all is decided by its
    trigger: first on the raw bytes of a view (`positions`), then on each candidate message
    parsed but not validated (`matches`). A sign found where nothing is wrong only costs a
    validation; a sign missed leaves the message as the server sent it.
    """

    def positions(self, body: bytes, api: Api) -> Iterator[int]:
        """Offsets in a view body at which the sign occurs, each inside the message it concerns."""
        ...

    def matches(self, raw_message: Any, api: Api) -> bool:
        """Whether one parsed, unvalidated message shows the sign."""
        ...


class Rule(Protocol):
    """A pure check of one message against the session's liveness.

    `name` is stable: it appears in logs, response headers and metrics. `trigger` says which
    messages the rule may change (it is only called on those); `durable` names the runtimes in
    which a write-back can make its change durable (v2 stores a message as what its event log
    says, and only a tool's failure has an event). A rule returns the changes it wants (empty
    when the message is consistent) and never performs I/O.
    """

    name: ClassVar[str]
    trigger: ClassVar[Trigger]
    durable: ClassVar[frozenset[Api]]

    def __call__(self, message: Message, liveness: Liveness) -> list[Change]: ...
