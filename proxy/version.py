"""Which settle-proxy runs: read from its installed distribution's metadata, so the version is
written once (`pyproject.toml`) and nothing imports the package's root to learn it (the root
builds the application on first use, so that import would run back up the layers)."""

from __future__ import annotations

from importlib.metadata import version

__all__ = ["VERSION"]

VERSION = version("settle-proxy")
