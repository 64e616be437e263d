"""Where the write-back works unless told: the one resolver of its default locations."""

from pathlib import Path

import pytest

from proxy.writeback.locations import Locations, locations

ENVIRON = {"XDG_DATA_HOME": "/data", "XDG_RUNTIME_DIR": "/run/user/1000"}


def test_given_locations_are_kept() -> None:
    assert locations(Path("/db"), Path("/locks"), environ=ENVIRON) == Locations(Path("/db"), Path("/locks"))


def test_unset_locations_are_where_the_environment_puts_them() -> None:
    assert locations(environ=ENVIRON) == Locations(
        Path("/data/opencode/opencode.db"), Path("/run/user/1000/settle-proxy")
    )


def test_unless_given_one_it_reads_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", "/process/data")
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/process/run")
    assert locations() == Locations(
        Path("/process/data/opencode/opencode.db"), Path("/process/run/settle-proxy")
    )
