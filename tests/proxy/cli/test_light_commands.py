"""`--help`, `--version` and a usage error load only the parser they ask: not the application,
its web server and client, its databases or its rules (which took a second to import)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("aiohttp", "aiosqlite", "pydantic", "orjson", "rules", "proxy.service.app", "proxy.relay.forward")
"""What only a command that serves, settles or lists processes needs."""

_HARNESS = """
import contextlib, json, sys
from proxy.cli.main import main
with contextlib.redirect_stdout(sys.stderr), contextlib.suppress(SystemExit):
    main(sys.argv[1:])
print(json.dumps(sorted(sys.modules)))
"""


def loaded_by(*arguments: str) -> set[str]:
    """The modules `settle-proxy ARGUMENTS` had loaded once it exited."""
    done = subprocess.run(
        [sys.executable, "-c", _HARNESS, *arguments], capture_output=True, text=True, timeout=60, check=True
    )
    return set(json.loads(done.stdout))


@pytest.mark.parametrize(
    "arguments", [["--help"], ["--version"], ["serve", "--help"], ["--port", "x"], ["--bogus"], ["setle"]]
)
def test_answering_the_command_line_loads_nothing_heavy(arguments: list[str]) -> None:
    loaded = loaded_by(*arguments)
    assert "proxy.cli.options" in loaded  # the parser was built
    assert [name for name in HEAVY if name in loaded] == []


def test_serving_loads_the_application() -> None:
    """What `test_answering_the_command_line_loads_nothing_heavy` says absent is what serving needs."""
    done = subprocess.run(
        [sys.executable, "-c", "import json, sys, proxy.cli.serving; print(json.dumps(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert [name for name in HEAVY if name not in json.loads(done.stdout)] == []
