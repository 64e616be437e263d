"""`pip install .` from a clone gives the console script, both packages and their type markers."""

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).parent.parent


def test_wheel_carries_packages_types_and_console_script(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--quiet",
            "--wheel-dir",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("settle_proxy-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"proxy/py.typed", "rules/py.typed", "proxy/cli/main.py", "rules/engine.py"} <= names
    assert not [name for name in names if name.startswith(("tests/", "bench/"))]
    (entry_points,) = [name for name in names if name.endswith("entry_points.txt")]
    assert "settle-proxy = proxy.cli.main:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
    (metadata,) = [name for name in names if name.endswith(".dist-info/METADATA")]
    requires = [
        line.removeprefix("Requires-Dist: ")
        for line in zipfile.ZipFile(wheel).read(metadata).decode().splitlines()
        if line.startswith("Requires-Dist: ")
    ]
    # The README's `pip install .` gets the smuggling fixes and, where it builds, uvloop: no extra.
    assert "aiohttp>=3.14.3" in requires
    assert 'uvloop>=0.19; sys_platform != "win32"' in requires
