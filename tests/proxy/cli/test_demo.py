"""`settle-proxy demo` without an opencode to run: one line saying how to get one, exit 2.

The demo itself runs against the real servers: `tests/integration/test_demo.py`.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from tests.proxy.conftest import settle_proxy


def _path_without_opencode(tmp_path: Path) -> str:
    """A search path holding this Python and nothing named opencode."""
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "python3").symlink_to(sys.executable)
    return str(folder)


def test_without_opencode_on_path_it_says_how_to_install_it(tmp_path: Path) -> None:
    result = settle_proxy("demo", env={"PATH": _path_without_opencode(tmp_path)})
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "settle-proxy demo: error: opencode is not on PATH: install it with `npm i -g opencode-ai` (1.x) "
        "or `npm i -g @opencode/cli` (2.x), or give --opencode PATH"
    ]


def test_a_missing_opencode_path_is_one_line(tmp_path: Path) -> None:
    result = settle_proxy("demo", "--opencode", str(tmp_path / "opencode"))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [f"settle-proxy demo: error: {tmp_path / 'opencode'}: no such file"]


@pytest.mark.parametrize("printed", ["0.9.1", "opencode v3.0.0", "some other tool 1.2.3"])
def test_a_program_of_no_known_line_is_one_line(tmp_path: Path, printed: str) -> None:
    program = tmp_path / "opencode"
    program.write_text(f"#!/bin/sh\necho '{printed}'\n")
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    result = settle_proxy("demo", env={"PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"})
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"settle-proxy demo: error: {program} --version printed {printed!r}: not an opencode 1.x or 2.x"
    ]
