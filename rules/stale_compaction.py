"""`stale-compaction`: a compaction left `running` in a session that is not active was cut off by a
crash, and is shown failed as the server itself fails it when the session next runs.

Only a runtime whose server settles compactions says how (2.x's `settleStaleCompactions`,
`rules.runtime_2x`); elsewhere the rule changes nothing. A compaction's only sign of life is
its creation, so a reading must vouch for that, as for a tool.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, ClassVar

from rules.changes import Change
from rules.liveness import Liveness
from rules.models import Api, Message
from rules.rule import Trigger
from rules.runtimes import runtime_for

__all__ = ["RUNNING_COMPACTION", "RunningCompaction", "StaleCompaction"]


class RunningCompaction:
    """A v2 compaction message (`"type":"compaction"`) whose status is `running`."""

    _TYPE = re.compile(rb'"type"\s*:\s*"compaction"')

    def positions(self, body: bytes, api: Api) -> Iterator[int]:
        if api is Api.V2 and b'"compaction"' in body:
            yield from (found.start() for found in self._TYPE.finditer(body))

    def matches(self, raw_message: Any, api: Api) -> bool:
        return (
            api is Api.V2
            and type(raw_message) is dict
            and raw_message.get("type") == "compaction"
            and raw_message.get("status") == "running"
        )


RUNNING_COMPACTION = RunningCompaction()


class StaleCompaction:
    """Fail a compaction left running in an inactive session, where the server would."""

    name: ClassVar[str] = "stale-compaction"
    trigger: ClassVar[Trigger] = RUNNING_COMPACTION
    durable: ClassVar[frozenset[Api]] = frozenset()
    """Only the server's own event bus writes a 2.x database."""

    def __call__(self, message: Message, liveness: Liveness) -> list[Change]:
        runtime = runtime_for(message)
        patch = runtime.failed_compaction(message)
        if patch is None or not liveness.vouches_for(runtime.last_alive(message)):
            return []
        target = runtime.target(message)
        reason = f"compaction {target.message} running in inactive session"
        return [Change(self.name, target, patch, reason, runtime.header_path)]
