"""Functions stay small and modules hold one concept: no function or method over 60 lines (its
decorators aside), so that a step can be read whole; a module may be as long as its one concept
needs, up to 600 lines, past which it surely holds two. Splits follow concepts, not a count."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREES = ("proxy", "rules", "tests", "bench", "scripts")
MODULE_LINES = 600
FUNCTION_LINES = 60


def _modules(root: Path = ROOT) -> list[Path]:
    return sorted(path for tree in TREES for path in (root / tree).rglob("*.py"))


def too_long(root: Path = ROOT) -> list[str]:
    """Every module and function past its bound, as `path: lines` or `path:line name: lines`."""
    found = []
    for path in _modules(root):
        source = path.read_text()
        name = path.relative_to(root)
        if (lines := len(source.splitlines())) > MODULE_LINES:
            found.append(f"{name}: {lines} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > FUNCTION_LINES:
                    found.append(f"{name}:{node.lineno} {node.name}: {length} lines")
    return found


def test_the_trees_hold_python() -> None:
    """The premise: the walk finds the project's modules (a wrong root would pass anything)."""
    found = {path.relative_to(ROOT).as_posix() for path in _modules()}
    assert {"proxy/relay/hooks.py", "rules/engine.py", "tests/test_sizes.py", "bench/run.py"} <= found


def test_no_module_or_function_is_past_its_bound() -> None:
    assert too_long() == []
