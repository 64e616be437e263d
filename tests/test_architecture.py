"""ARCHITECTURE.md and the docs' layout (docs/architecture.md) name the code as it is: every path they name exists,
and the tree names every subpackage of `proxy` and every module of `proxy`, `rules` and `bench`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURE = (ROOT / "ARCHITECTURE.md").read_text()
ARCHITECTURE_PAGE = (ROOT / "docs" / "architecture.md").read_text()
LAYOUT = ARCHITECTURE_PAGE[ARCHITECTURE_PAGE.index("## Layout") :].split("\n## ", 1)[0]
PACKAGES = ("proxy", "rules", "bench")
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


def _blocks() -> dict[str, str]:
    """The tree's text per package (`rules`, `proxy`, `proxy/relay`, ...): a line naming a package
    at the left margin or one level in starts its block, deeper lines go on with it."""
    blocks: dict[str, str] = {}
    top = current = ""
    for line in _tree():
        indent, first = len(line) - len(line.lstrip()), line.split()[0]
        if indent == 0:
            top = current = first.rstrip("/")
        elif indent == 2:
            current = f"{top}/{first.rstrip('/')}" if first.endswith("/") else top
        blocks[current] = blocks.get(current, "") + line + "\n"
    return blocks


def _modules() -> list[Path]:
    found = [path for package in PACKAGES for path in (ROOT / package).rglob("*.py")]
    return sorted(path.relative_to(ROOT) for path in found if path.name != "__init__.py")


@pytest.mark.parametrize("module", _modules(), ids=str)
def test_the_tree_names_every_module(module: Path) -> None:
    """Each module by its own name, in its package's block (a hyphenated addon name is not it)."""
    block = _blocks().get(str(module.parent), "")
    assert re.search(rf"(?<![\w-]){re.escape(module.stem)}(?:\.py)?(?![\w-])", block), (
        f"{module} is not named in ARCHITECTURE.md's tree under {module.parent}/"
    )
