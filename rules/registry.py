"""The rules that run by default, in order. Adding a rule means adding it here."""

from __future__ import annotations

from rules.orphaned_tool import OrphanedTool
from rules.rule import Rule
from rules.unfinished_message import UnfinishedMessage

DEFAULT_RULES: tuple[Rule, ...] = (OrphanedTool(), UnfinishedMessage())
