"""ARCHITECTURE.md and the docs' layout (docs/architecture.md) name the code as it is: every path they name exists,
and its tables name every package and every module of `proxy`, `rules` and `bench`, one row each."""

from __future__ import annotations

import ast
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


SOURCES = ("proxy", "rules")
"""The product's packages, where each name has one meaning."""
SHARED_MODULE_NAMES = {
    "client.py": "an HTTP client of opencode's server (the proxy's own calls; the demo's)",
    "liveness.py": "whether a session is active (as the rules read it; as the proxy asks it)",
    "options.py": "what a package is configured with (the command line's; the relay's)",
    "runtimes.py": "the message APIs (their shapes, in `rules`; their routes, in `proxy/opencode`)",
    "stopping.py": "how the proxy stops (on a signal; what that does to the exchanges under way)",
}
"""Module names two packages use in one meaning, each package's side of the same thing."""
CLASSES_BEING_MERGED = {"_Read"}
"""Class names still defined in more than one module, until the live confirmations, which each read
on their own, are configurations of one confirmer."""


def _sources() -> list[Path]:
    return sorted(path for package in SOURCES for path in (ROOT / package).rglob("*.py"))


def _shared(names: list[tuple[str, Path]]) -> dict[str, list[str]]:
    where: dict[str, set[str]] = {}
    for name, path in names:
        where.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return {name: sorted(paths) for name, paths in where.items() if len(paths) > 1}


def test_no_class_name_is_defined_in_two_modules() -> None:
    classes = [
        (node.name, path)
        for path in _sources()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
    ]
    twice = {name: paths for name, paths in _shared(classes).items() if name not in CLASSES_BEING_MERGED}
    assert twice == {}, f"each class name has one meaning, so one definition: {twice}"


def test_no_module_name_means_two_things() -> None:
    modules = [(path.name, path) for path in _sources() if path.name != "__init__.py"]
    shared = {name: paths for name, paths in _shared(modules).items() if name not in SHARED_MODULE_NAMES}
    assert shared == {}, f"a module name shared by two packages must mean one thing: {shared}"
