"""The README's commands and examples are true."""

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from proxy import Settings
from tests.fixtures import load

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.DOTALL)


def test_exactly_two_setup_commands_and_ci_runs_the_second() -> None:
    setup = README.split("## Set up", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```sh\n(.*?)\n```", setup, flags=re.DOTALL)
    assert len(commands) == 2
    install_and_run, run_tests = commands
    assert install_and_run.startswith("pip install . && settle-proxy ")
    assert run_tests in (ROOT / ".ci" / "run").read_text()


def test_console_script_is_declared() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["settle-proxy"] == "proxy.cli.main:main"


def test_mount_example(monkeypatch: pytest.MonkeyPatch) -> None:
    served: list[web.Application] = []
    monkeypatch.setattr(web, "run_app", lambda app, **_: served.append(app))
    example = next(block for block in blocks("python") if "mount(" in block)
    exec(example, {})
    (app,) = served
    (subapp,) = [resource for resource in app.router.resources() if resource.canonical == "/opencode"]
    assert subapp is not None
    assert isinstance(Settings, type)


def test_settle_view_example() -> None:
    example = next(block for block in blocks("python") if "settle_view(" in block)
    namespace: dict[str, Any] = {
        "document": load("v2-message-stale-running.json"),
        "session_id": "ses_dd6bd0f33ffejRStwdnQDIkDom",
    }
    exec(example, namespace)
    assert namespace["document"]["data"][0]["content"][0]["state"]["status"] == "error"
    assert [change.rule for change in namespace["view"].changes] == ["orphaned-tool", "unfinished-message"]
