"""The byte scan that finds which messages of a view body the rules may have to see.

It runs on every body of a message route before anything is parsed, so it only looks for
bytes: each rule's trigger says what its bytes look like (`rules.Trigger.positions`), and the
scan is their union, taken once per body.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from rules import DEFAULT_RULES, Api, Rule, triggers_of


def trigger_offsets(body: bytes, api: Api, rules: Sequence[Rule] = DEFAULT_RULES) -> list[int]:
    """Every offset at which a trigger of `rules` occurs in `body`, in order (empty: no rule
    has anything to look at)."""
    return sorted({position for trigger in triggers_of(rules) for position in trigger.positions(body, api)})


def candidates(starts: list[int], positions: Sequence[int]) -> list[int]:
    """Indexes of the messages (starting at `starts`) in which a trigger occurs, in order."""
    indexes = {bisect.bisect_right(starts, position) - 1 for position in positions}
    return sorted(index for index in indexes if index >= 0)
