"""What an opencode process of the tests is given: its environment (XDG dirs of its own, one
config dir for the whole test run) and each project's opencode.json (the mock model)."""

from __future__ import annotations

import os
from pathlib import Path

from proxy.demo.lines import Line1x


def opencode_environment(root: Path) -> dict[str, str]:
    """The environment an opencode process of the tests gets: data, state and cache dirs of its own
    under `root`, no auto-update, and no password inherited from the developer's shell.

    The config dir is shared by every opencode of the test run (it sits beside `root`, in pytest's
    base temp dir): the first start npm-installs `@opencode-ai/plugin` (~64 MB) into it, and doing
    that once per run instead of once per server keeps a slow registry answer out of every start-up.
    It holds nothing per server: each project's provider config is in the project's own directory.
    """
    env = dict(os.environ)
    dirs = {"CONFIG": root.parent / "opencode-shared-config"} | {
        name: root / "xdg" / name.lower() for name in ("DATA", "STATE", "CACHE")
    }
    for name, xdg_dir in dirs.items():
        xdg_dir.mkdir(parents=True, exist_ok=True)
        env[f"XDG_{name}_HOME"] = str(xdg_dir)
    env["OPENCODE_DISABLE_AUTOUPDATE"] = "1"
    env.pop("OPENCODE_SERVER_PASSWORD", None)
    return env


def project_config(model_base_url: str) -> dict[str, object]:
    """A project's opencode.json: its only model is the mock one, and every tool is allowed
    (`proxy.demo.lines.Line1x.config`)."""
    return Line1x().config(model_base_url)
