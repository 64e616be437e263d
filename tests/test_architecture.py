"""ARCHITECTURE.md and the docs' layout (docs/architecture.md) name the code as it is: every path they name exists,
and its tables name every package and every module of `proxy`, `rules` and `bench`, one row each."""

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


def _tables() -> dict[str, set[str]]:
    """The modules each package's table names (`rules`, `proxy`, `proxy/relay`, ...): a `### `
    heading naming the package starts it, each row's first cell names one module."""
    tables: dict[str, set[str]] = {}
    current = None
    for line in ARCHITECTURE.split("## Modules", 1)[1].split("\n## ", 1)[0].splitlines():
        if heading := re.fullmatch(r"### `([a-z_/]+)/`", line):
            current = tables.setdefault(heading.group(1), set())
        elif current is not None and (row := re.match(r"\| `([a-z_0-9]+\.py)` \|", line)):
            current.add(row.group(1))
    return tables


def _named_paths(text: str) -> set[str]:
    return set(_PATH.findall(text))


@pytest.mark.parametrize("path", sorted(_named_paths(ARCHITECTURE) | _named_paths(LAYOUT)))
def test_every_named_path_exists(path: str) -> None:
    candidates = [ROOT / path, ROOT / "proxy" / path]
    assert any(candidate.exists() for candidate in candidates), f"{path} is named but does not exist"


def test_the_tables_name_every_package() -> None:
    packages = {
        str(path.parent.relative_to(ROOT))
        for package in PACKAGES
        for path in (ROOT / package).rglob("__init__.py")
    }
    assert set(_tables()) == packages


def _modules() -> list[Path]:
    found = [path for package in PACKAGES for path in (ROOT / package).rglob("*.py")]
    return sorted(path.relative_to(ROOT) for path in found if path.name != "__init__.py")


@pytest.mark.parametrize("module", _modules(), ids=str)
def test_the_tables_name_every_module(module: Path) -> None:
    assert module.name in _tables().get(str(module.parent), set()), (
        f"{module} has no row in ARCHITECTURE.md's table of {module.parent}/"
    )


def test_every_row_is_a_module() -> None:
    named = {f"{package}/{name}" for package, names in _tables().items() for name in names}
    assert named == {str(module) for module in _modules()}
