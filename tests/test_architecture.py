"""ARCHITECTURE.md and the README's layout name the code as it is: every path they name exists,
and the tree names every subpackage of `proxy` and every module of `rules`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURE = (ROOT / "ARCHITECTURE.md").read_text()
README = (ROOT / "README.md").read_text()
LAYOUT = README[README.index("## Layout") :].split("\nDependencies", 1)[0]
_PATH = re.compile(r"`((?:[a-z_]+/)+(?:[a-z_]+\.(?:py|toml|md))?)`")


def _tree() -> list[str]:
    return ARCHITECTURE.split("```")[1].strip().splitlines()


def _named_paths(text: str) -> set[str]:
    return set(_PATH.findall(text))


@pytest.mark.parametrize("path", sorted(_named_paths(ARCHITECTURE) | _named_paths(LAYOUT)))
def test_every_named_path_exists(path: str) -> None:
    candidates = [ROOT / path, ROOT / "proxy" / path]
    assert any(candidate.exists() for candidate in candidates), f"{path} is named but does not exist"


def test_the_tree_names_every_subpackage_of_proxy() -> None:
    named = {line.split()[0] for line in _tree() if line.startswith("  ") and line.split()[0].endswith("/")}
    actual = {f"{path.name}/" for path in (ROOT / "proxy").iterdir() if (path / "__init__.py").exists()}
    assert named == actual


def test_the_tree_names_every_module_of_rules() -> None:
    lines = _tree()
    rules_lines = lines[lines.index(next(line for line in lines if line.startswith("rules/"))) + 1 :]
    rules_lines = rules_lines[: next(i for i, line in enumerate(rules_lines) if not line.startswith("  "))]
    named = {name.strip() for line in rules_lines for name in re.split(r"\s{2,}", line.strip())[0].split(",")}
    actual = {path.stem for path in (ROOT / "rules").glob("*.py")} - {"__init__"}
    assert named == actual
