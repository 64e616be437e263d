"""The command line is the one reader of the environment: given a mapping, it decides everything."""

from __future__ import annotations

import re
from pathlib import Path

from yarl import URL

from proxy.cli.options import build_parser, opencode_authorization, settings_from, state_path
from proxy.service.config import basic_authorization
from proxy.writeback.modes import WriteBackMode

HOME = Path.home()
SERVICE = Path(__file__).resolve().parents[3] / "proxy" / "service"


def test_settings_from_a_given_environment() -> None:
    environ = {
        "SETTLE_UPSTREAM": "http://127.0.0.1:5000",
        "SETTLE_WRITE_BACK": "db",
        "SETTLE_GRACE": "0.5",
        "OPENCODE_SERVER_PASSWORD": "s3cret",
        "OPENCODE_SERVER_USERNAME": "me",
        "XDG_DATA_HOME": "/data",
        "XDG_STATE_HOME": "/state",
        "XDG_RUNTIME_DIR": "/run/user/1000",
        "SETTLE_AUTH": "user:pass",
    }
    settings = settings_from(build_parser(environ=environ).parse_args([]), environ)
    assert settings.upstream == URL("http://127.0.0.1:5000")
    assert settings.write_back is WriteBackMode.DB
    assert settings.grace == 0.5
    assert settings.authorization == basic_authorization("me", "s3cret")
    assert settings.db_path == Path("/data/opencode/opencode.db")
    assert settings.state_db == Path("/state/settle-proxy/processes.db")
    assert settings.lock_dir == Path("/run/user/1000/settle-proxy")
    assert settings.auth == ("user", "pass")


def test_an_empty_environment_gives_the_defaults() -> None:
    settings = settings_from(build_parser(environ={}).parse_args([]), {})
    assert settings.upstream == URL("http://127.0.0.1:4096")
    assert (settings.host, settings.port) == ("127.0.0.1", 4097)
    assert settings.authorization is None
    assert settings.auth is None
    assert settings.db_path == HOME / ".local" / "share" / "opencode" / "opencode.db"
    assert settings.state_db == HOME / ".local" / "state" / "settle-proxy" / "processes.db"


def test_settle_db_names_the_database_of_both_commands() -> None:
    from proxy.cli import offline  # noqa: PLC0415 - the other command that takes --db

    environ = {"SETTLE_DB": "/elsewhere/opencode.db", "XDG_DATA_HOME": "/data"}
    assert build_parser(environ=environ).parse_args([]).db == Path("/elsewhere/opencode.db")
    assert offline.build_parser(environ).parse_args([]).db == Path("/elsewhere/opencode.db")


def test_opencode_credentials_need_a_password() -> None:
    assert opencode_authorization({"OPENCODE_SERVER_USERNAME": "me"}) is None
    assert opencode_authorization({"OPENCODE_SERVER_PASSWORD": "pw"}) == basic_authorization("opencode", "pw")


def test_the_state_database_follows_xdg_state_home() -> None:
    assert state_path({"XDG_STATE_HOME": "/s"}) == Path("/s/settle-proxy/processes.db")


def test_the_application_reads_no_environment() -> None:
    """It is given settings and resolved locations (`proxy.writeback.locations`), never `os.environ`."""
    reading = re.compile(r"\benviron\b|\bgetenv\b")
    assert [path.name for path in SERVICE.glob("*.py") if reading.search(path.read_text())] == []
