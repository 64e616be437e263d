"""Exit 0 when this checkout is installed (editable) and every requirement that pyproject.toml
states for the given extras is satisfied.

`scripts/setup.sh` asks this before calling pip, so that a second run installs nothing (pip
would rebuild and reinstall the editable package every time). The requirements are read from
pyproject.toml, not from the installed metadata, so a newly added dependency is noticed.
"""

from __future__ import annotations

import json
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from pip._vendor.packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent


def requirements(project: dict[str, object], extras: set[str]) -> list[Requirement]:
    """The project's requirements with those of `extras`, self-references (`name[extra]`) followed."""
    name = str(project["name"])
    optional: dict[str, list[str]] = project.get("optional-dependencies", {})  # type: ignore[assignment]
    found = [Requirement(text) for text in project.get("dependencies", [])]  # type: ignore[attr-defined]
    seen: set[str] = set()
    pending = list(extras)
    while pending:
        extra = pending.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for requirement in map(Requirement, optional.get(extra, [])):
            if requirement.name == name:
                pending += requirement.extras
            else:
                found.append(requirement)
    return found


def satisfied(requirement: Requirement) -> bool:
    if requirement.marker is not None and not requirement.marker.evaluate():
        return True
    try:
        version = metadata.version(requirement.name)
    except metadata.PackageNotFoundError:
        return False
    return requirement.specifier.contains(version, prereleases=True)


def installed_here(name: str) -> bool:
    """Whether `name` is installed editable from this very checkout."""
    try:
        distribution = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return False
    origin = json.loads(distribution.read_text("direct_url.json") or "{}")
    return origin.get("url") == ROOT.as_uri() and bool(origin.get("dir_info", {}).get("editable"))


def main(extras: set[str]) -> int:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    if not installed_here(project["name"]):
        return 1
    return 0 if all(map(satisfied, requirements(project, extras))) else 1


if __name__ == "__main__":
    sys.exit(main(set(sys.argv[1].split(",")) if len(sys.argv) > 1 else set()))
