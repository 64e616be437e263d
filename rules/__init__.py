"""Pure consistency rules: opencode message views checked against the server's liveness.

Nothing here performs I/O or knows about HTTP or SQLite, so the same rules serve the proxy,
write-back, the offline `settle` command and any other framework.
"""

from rules.changes import Change, apply_changes, changed_object, merge_patch
from rules.engine import Settlement, UnexpectedShape, settle
from rules.liveness import Liveness
from rules.models import Api, Message, V1Message, V2Message
from rules.registry import DEFAULT_RULES
from rules.rule import Rule
from rules.runtimes import V1, V2, Runtime, runtime_for, runtime_of
from rules.targets import OpenTool, Target
from rules.tools import OPEN_STATUSES
from rules.views import SettledMessages, ViewSettlement, messages_of, settle_view, with_messages

__all__ = [
    "DEFAULT_RULES",
    "OPEN_STATUSES",
    "V1",
    "V2",
    "Api",
    "Change",
    "Liveness",
    "Message",
    "OpenTool",
    "Rule",
    "Runtime",
    "SettledMessages",
    "Settlement",
    "Target",
    "UnexpectedShape",
    "V1Message",
    "V2Message",
    "ViewSettlement",
    "apply_changes",
    "changed_object",
    "merge_patch",
    "messages_of",
    "runtime_for",
    "runtime_of",
    "settle",
    "settle_view",
    "with_messages",
]
