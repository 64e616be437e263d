"""Pure consistency rules: opencode message views checked against the server's liveness.

Nothing here performs I/O or knows about HTTP or SQLite, so the same rules serve the proxy,
write-back, the offline `settle` command and any other framework.
"""

from rules.changes import Change, apply_changes, changed_object, merge_patch
from rules.engine import Settlement, UnexpectedShape, settle
from rules.liveness import FRESH_MARGIN_MS, Doubt, Liveness
from rules.models import Api, JSONObject, Message, V1Message, V2Message
from rules.orphaned_tool import OrphanedTool
from rules.registry import DEFAULT_RULES, REGISTRY, Registry, needs_settling, triggers_of
from rules.rule import Rule, Trigger
from rules.runtime_2x import AMBIGUOUS, V2X, Runtime2x
from rules.runtimes import V1, V1_ABORTED, V1_ERROR, V2, V2_ERROR, Runtime, runtime_for, runtime_of
from rules.stale_compaction import StaleCompaction
from rules.targets import OpenTool, Target
from rules.tools import OPEN_STATUSES, is_open_tool, tool_status
from rules.triggers import OPEN_TOOL_TRIGGER, UNFINISHED_ASSISTANT_TRIGGER
from rules.unfinished_message import UnfinishedMessage
from rules.views import SettledMessages, ViewSettlement, messages_of, settle_view, with_messages

__all__ = [
    "AMBIGUOUS",
    "DEFAULT_RULES",
    "FRESH_MARGIN_MS",
    "OPEN_STATUSES",
    "OPEN_TOOL_TRIGGER",
    "REGISTRY",
    "UNFINISHED_ASSISTANT_TRIGGER",
    "V1",
    "V1_ABORTED",
    "V1_ERROR",
    "V2",
    "V2X",
    "V2_ERROR",
    "Api",
    "Change",
    "Doubt",
    "JSONObject",
    "Liveness",
    "Message",
    "OpenTool",
    "OrphanedTool",
    "Registry",
    "Rule",
    "Runtime",
    "Runtime2x",
    "SettledMessages",
    "Settlement",
    "StaleCompaction",
    "Target",
    "Trigger",
    "UnexpectedShape",
    "UnfinishedMessage",
    "V1Message",
    "V2Message",
    "ViewSettlement",
    "apply_changes",
    "changed_object",
    "is_open_tool",
    "merge_patch",
    "messages_of",
    "needs_settling",
    "runtime_for",
    "runtime_of",
    "settle",
    "settle_view",
    "tool_status",
    "triggers_of",
    "with_messages",
]
