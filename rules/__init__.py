"""Pure consistency rules: opencode message views checked against the server's liveness.

Nothing here performs I/O or knows about HTTP or SQLite, so the same rules serve the proxy,
write-back, the offline `settle` command and any other framework.
"""

from rules.changes import Change, apply_changes, merge_patch
from rules.engine import Settlement, UnexpectedShape, settle
from rules.liveness import Liveness
from rules.models import Api, Message, V1Message, V2Message
from rules.registry import DEFAULT_RULES
from rules.rule import Rule
from rules.tools import OPEN_STATUSES
from rules.views import (
    SettledMessages,
    Target,
    ViewSettlement,
    messages_of,
    settle_view,
    target_of,
    with_messages,
)

__all__ = [
    "DEFAULT_RULES",
    "OPEN_STATUSES",
    "Api",
    "Change",
    "Liveness",
    "Message",
    "Rule",
    "SettledMessages",
    "Settlement",
    "Target",
    "UnexpectedShape",
    "V1Message",
    "V2Message",
    "ViewSettlement",
    "apply_changes",
    "merge_patch",
    "messages_of",
    "settle",
    "settle_view",
    "target_of",
    "with_messages",
]
