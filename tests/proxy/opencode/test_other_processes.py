"""Other processes on the upstream's database, surveyed from a fake `/proc` tree."""

import os
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import closing, suppress
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import pytest
from aiohttp.test_utils import TestServer
from rich.console import Console
from yarl import URL

from proxy.addons.settle import SETTLED_HEADER
from proxy.cli.offline import Exit, build_parser, run
from proxy.opencode import other_processes as processes
from proxy.opencode.other_processes import START_MARGIN_MS, OtherProcess, Survey, survey
from tests.fixtures import compact, load
from tests.fixtures.stale_db import DIRECTORY, V1_SESSION, V2_SESSION, build_stale_db
from tests.proxy.conftest import ProxyClient, following, publish
from tests.proxy.fake_opencode import FakeOpencode

BOOT_S = 1_795_900_000
DB = "/home/dev/.local/share/opencode/opencode.db"
V2 = "ses_dd6bd0f33ffejRStwdnQDIkDom"
V2_LAST_ALIVE = 1795988584703
"""The latest time in `v2-message-stale-running.json` (its tool's `ran`)."""
V1 = "ses_dd6bcdaa7ffenxavFWr4GKPq95"
V1_CREATED = 1795988598698
"""When the assistant message of `v1-message-stale-running.json` was created."""
PORT = 4096


@dataclass
class FakeProc:
    """A `/proc` tree: `/proc/stat`, `/proc/net/tcp{,6}` and one directory per process."""

    root: Path
    tcp: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        (self.root / "net").mkdir(parents=True)
        (self.root / "stat").write_text(f"cpu  1 2 3 4\nbtime {BOOT_S}\nprocesses 9\n")
        self.listen(PORT, "111")

    def listen(self, port: int, inode: str, *, state: str = "0A", table: str = "tcp") -> None:
        self.tcp.append(
            f"   0: 0100007F:{port:04X} 00000000:0000 {state} 00000000:00000000 00:00000000 00000000"
            f"     0        0 {inode} 1 0000000000000000 100 0 0 10 0"
        )
        header = (
            "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode"
        )
        (self.root / "net" / table).write_text("\n".join([header, *self.tcp]) + "\n")

    def process(
        self, pid: int, *links: str, started_at: int = 0, comm: str = "opencode", flags: int = 0
    ) -> None:
        """A process whose fds point at `links`, started at `started_at` (epoch ms, before the margin)."""
        directory = self.root / str(pid)
        (directory / "fd").mkdir(parents=True)
        for number, target in enumerate(links):
            (directory / "fd" / str(number)).symlink_to(target)
        ticks = (started_at - BOOT_S * 1000) * os.sysconf("SC_CLK_TCK") // 1000
        fields = ["S", "1", "1", "1", "0", "-1", str(flags), *["0"] * 12, str(ticks), "0"]
        (directory / "stat").write_text(f"{pid} ({comm}) {' '.join(fields)}\n")
        (directory / "cmdline").write_bytes(b"\0".join(part.encode() for part in (comm, "serve")) + b"\0")

    def unreadable(self, pid: int, *, flags: int = 0) -> None:
        """A process whose fds cannot be listed (as another user's; root would read any)."""
        self.process(pid, flags=flags)
        (self.root / str(pid) / "fd").rmdir()
        (self.root / str(pid) / "fd").write_text("")


@pytest.fixture
def proc(tmp_path: Path) -> FakeProc:
    return FakeProc(tmp_path / "proc")


UPSTREAM = URL(f"http://127.0.0.1:{PORT}")


def test_finds_the_upstream_its_database_and_the_other_holders(proc: FakeProc) -> None:
    proc.process(100, "socket:[111]", DB, DB + "-wal", DB + "-shm", started_at=BOOT_S * 1000 + 5_000)
    proc.process(200, "/dev/null", DB, started_at=BOOT_S * 1000 + 50_000, comm="opencode")
    proc.process(300, DB, f"/memfd:{processes.MARKER} (deleted)", started_at=BOOT_S * 1000 + 60_000)
    proc.process(400, "/elsewhere/opencode.db", started_at=BOOT_S * 1000 + 1_000)
    proc.process(500, DB, started_at=BOOT_S * 1000 + 2_000)
    proc.process(600, DB + "-wal", "socket:[222]", started_at=BOOT_S * 1000 + 3_000)
    proc.process(700, DB, started_at=BOOT_S * 1000 + 40_000, comm="tui (x) y")
    found = survey(UPSTREAM, proc=proc.root, own_pid=500, now_ms=BOOT_S * 1000 + 90_000)
    assert found.unknown is None
    assert found.upstream_pids == (100,)
    assert found.databases == (DB,)
    assert found.others == (
        OtherProcess(200, BOOT_S * 1000 + 50_000 - START_MARGIN_MS, "opencode serve"),
        OtherProcess(700, BOOT_S * 1000 + 40_000 - START_MARGIN_MS, "tui (x) y serve"),
    )
    assert found.bound == BOOT_S * 1000 + 40_000 - START_MARGIN_MS
    assert found.not_inspected == 0


def test_the_survey_time_bounds_when_no_other_process_holds_the_database(proc: FakeProc) -> None:
    proc.process(100, "socket:[111]", DB)
    found = survey(UPSTREAM, proc=proc.root, own_pid=1, now_ms=1234)
    assert found.others == ()
    assert found.bound == 1234


def test_a_listener_on_another_port_or_a_connected_socket_is_not_the_upstream(proc: FakeProc) -> None:
    proc.listen(PORT + 1, "333", table="tcp6")
    proc.listen(PORT, "444", state="01")
    proc.process(100, "socket:[333]", "socket:[444]", DB)
    found = survey(UPSTREAM, proc=proc.root, own_pid=1)
    assert found.bound is None
    assert found.unknown is not None
    assert "is not among those readable here" in found.unknown


@pytest.mark.parametrize(
    ("upstream", "why"),
    [
        ("http://10.1.2.3:4096", "is not on this host's loopback"),
        ("http://opencode.internal:4096", "is not on this host's loopback"),
        (f"http://127.0.0.1:{PORT + 7}", "listens in no socket seen here"),
    ],
)
def test_an_upstream_that_cannot_be_found_gives_no_bound(proc: FakeProc, upstream: str, why: str) -> None:
    proc.process(100, "socket:[111]", DB)
    found = survey(URL(upstream), proc=proc.root, own_pid=1)
    assert found.bound is None
    assert found.unknown is not None
    assert why in found.unknown


def test_a_listener_still_open_is_not_looked_up_again(proc: FakeProc) -> None:
    proc.process(100, "socket:[111]", DB)
    proc.process(200, "socket:[999]", "/elsewhere/opencode.db")
    first = survey(UPSTREAM, proc=proc.root, own_pid=1)
    assert first.listeners == ("111",)
    (proc.root / "net" / "tcp").write_text("")
    assert survey(UPSTREAM, proc=proc.root, own_pid=1, listeners=first.listeners).upstream_pids == (100,)
    trusted = survey(UPSTREAM, proc=proc.root, own_pid=1, listeners=("999",))
    assert trusted.upstream_pids == (200,)
    proc.listen(PORT, "777")
    gone = survey(UPSTREAM, proc=proc.root, own_pid=1, listeners=("404",))
    assert gone.listeners == ("111", "777")
    assert gone.upstream_pids == (100,)


def test_ipv6_and_localhost_upstreams_are_on_loopback(proc: FakeProc) -> None:
    proc.process(100, "socket:[111]", DB)
    for upstream in (f"http://[::1]:{PORT}", f"http://localhost:{PORT}"):
        assert survey(URL(upstream), proc=proc.root, own_pid=1).upstream_pids == (100,)


def test_an_upstream_holding_no_opencode_database_gives_no_bound(proc: FakeProc) -> None:
    proc.process(100, "socket:[111]", "/var/lib/other.db")
    found = survey(UPSTREAM, proc=proc.root, own_pid=1)
    assert found.bound is None
    assert found.unknown is not None
    assert "holds no opencode database" in found.unknown


def test_no_proc_gives_no_bound(tmp_path: Path) -> None:
    found = survey(UPSTREAM, proc=tmp_path / "nothing", own_pid=1)
    assert found.bound is None
    assert found.unknown is not None
    assert "not Linux" in found.unknown


def test_processes_of_other_users_are_counted_kernel_threads_are_not(proc: FakeProc) -> None:
    proc.process(100, "socket:[111]", DB)
    proc.unreadable(200)
    proc.unreadable(300, flags=0x00200000)
    found = survey(UPSTREAM, proc=proc.root, own_pid=1)
    assert found.not_inspected == 1
    assert found.bound is not None


def test_with_a_known_database_an_unidentified_upstream_counts_as_another_holder(
    proc: FakeProc, tmp_path: Path
) -> None:
    database = tmp_path / "renamed.db"
    database.touch()
    proc.process(100, str(database), started_at=BOOT_S * 1000 + 7_000)
    proc.process(200, "socket:[111]", str(database), started_at=BOOT_S * 1000 + 3_000)
    remote = survey(URL("http://10.1.2.3:4096"), database=database, proc=proc.root, own_pid=1)
    assert [other.pid for other in remote.others] == [100, 200]
    local = survey(UPSTREAM, database=database, proc=proc.root, own_pid=1)
    assert [other.pid for other in local.others] == [100]
    assert local.bound == BOOT_S * 1000 + 7_000 - START_MARGIN_MS


def test_the_bound_is_the_earliest_other_start_or_the_survey_time() -> None:
    others = (OtherProcess(1, 5_000, "a"), OtherProcess(2, 3_000, "b"))
    assert Survey(10_000, others=others).bound == 3_000
    assert Survey(2_000, others=others).bound == 2_000
    assert Survey(10_000, unknown="why", others=others).bound is None


def test_the_real_proc_finds_this_process_listening() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        found = survey(URL(f"http://127.0.0.1:{server.getsockname()[1]}"), own_pid=1)
    assert found.upstream_pids == (os.getpid(),)
    assert found.unknown is not None
    assert "holds no opencode database" in found.unknown


@pytest.fixture
def other_server(proc: FakeProc, upstream: TestServer, monkeypatch: pytest.MonkeyPatch) -> FakeProc:
    """The fake upstream listening, holding DB; `proc.process(...)` adds other holders."""
    assert upstream.port is not None
    proc.listen(upstream.port, "555")
    proc.process(100, "socket:[555]", DB, started_at=BOOT_S * 1000)
    monkeypatch.setattr(processes, "PROC", proc.root)
    monkeypatch.setattr(processes, "MAX_AGE_S", 0.0)
    return proc


async def test_a_view_alive_after_another_holder_started_is_left_alone(
    proxy: ProxyClient, fake: FakeOpencode, other_server: FakeProc
) -> None:
    fake.bodies[f"/api/session/{V2}/message"] = compact("v2-message-stale-running.json")
    other_server.process(200, DB, started_at=V2_LAST_ALIVE - 60_003)  # a whole tick
    response = await proxy.get(f"/api/session/{V2}/message")
    assert SETTLED_HEADER not in response.headers
    assert orjson.loads(await response.read()) == load("v2-message-stale-running.json")
    health = await (await proxy.get("/_settle/health")).json()
    assert health["other_processes"]["known"] is True
    assert health["other_processes"]["upstream_pids"] == [100]
    assert health["other_processes"]["others"] == [
        {"pid": 200, "started_at": V2_LAST_ALIVE - 60_003 - START_MARGIN_MS, "program": "opencode"}
    ]


async def test_a_view_alive_before_every_other_holder_started_is_settled(
    proxy: ProxyClient, fake: FakeOpencode, other_server: FakeProc
) -> None:
    fake.bodies[f"/api/session/{V2}/message"] = compact("v2-message-stale-running.json")
    other_server.process(200, DB, started_at=V2_LAST_ALIVE + 60_000)
    response = await proxy.get(f"/api/session/{V2}/message")
    assert response.headers[SETTLED_HEADER] == "1"


async def test_a_reading_kept_from_the_event_stream_is_bounded_too(
    proxy: ProxyClient, fake: FakeOpencode, other_server: FakeProc
) -> None:
    fake.bodies[f"/session/{V1}/message"] = original = compact("v1-message-stale-running.json")
    other_server.process(200, DB, started_at=V1_CREATED - 60_000)
    await following(proxy)
    await publish(proxy, fake, "session.status", V1, status={"type": "idle"})
    response = await proxy.get(f"/session/{V1}/message")
    assert await response.read() == original
    assert fake.liveness_requests == 0


async def test_health_says_why_other_processes_are_unknown(proxy: ProxyClient) -> None:
    health = await (await proxy.get("/_settle/health")).json()
    assert health["other_processes"]["known"] is False
    assert "holds no opencode database" in health["other_processes"]["why"]


def test_a_marked_process_shows_its_marker_in_its_fd_table() -> None:
    processes.mark_this_process()
    processes.mark_this_process()
    links = []
    for fd in os.listdir("/proc/self/fd"):
        with suppress(FileNotFoundError):  # the listing's own descriptor, closed by now
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
    assert links.count(f"/memfd:{processes.MARKER} (deleted)") == 1


@pytest.fixture
def stale_db(tmp_path: Path) -> Path:
    return build_stale_db(tmp_path / "opencode.db")


@pytest.fixture
def second_holder(stale_db: Path) -> Iterator[None]:
    """Another process holding the database open, started now: after every time the fixture records."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import sqlite3, time; c = sqlite3.connect({str(stale_db)!r}); "
            "c.execute('select 1 from part').fetchall(); print('open', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == b"open\n"
        yield
    finally:
        holder.kill()
        holder.wait()


async def test_offline_with_upstream_leaves_alone_what_another_holder_may_run(
    stale_db: Path, second_holder: None, fake: FakeOpencode, upstream: TestServer
) -> None:
    fake.directories[V1_SESSION] = DIRECTORY
    with closing(sqlite3.connect(stale_db)) as db, db:
        db.execute(
            "UPDATE part SET data = json_set(data, '$.state.time.start', ?) WHERE data LIKE '%running%'",
            (int(time.time() * 1000),),
        )
        before = db.execute("SELECT data FROM part WHERE session_id = ?", (V1_SESSION,)).fetchall()
    args = build_parser().parse_args(["--db", str(stale_db), "--upstream", str(upstream.make_url("/"))])
    console = Console(record=True, width=200)
    assert await run(args, console) == Exit.SETTLED
    text = console.export_text()
    assert "1 tool call(s) left alone: another process may run them" in text
    assert "settled 1 tool call(s) in 1 session(s)" in text
    with closing(sqlite3.connect(stale_db)) as db:
        assert db.execute("SELECT data FROM part WHERE session_id = ?", (V1_SESSION,)).fetchall() == before
        (v2,) = db.execute("SELECT data FROM session_message WHERE session_id = ?", (V2_SESSION,)).fetchone()
    assert '"status":"running"' not in v2


async def test_a_survey_is_reused_for_a_while_and_what_is_unknown_is_said_once(
    proc: FakeProc, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(processes, "PROC", proc.root)
    around = processes.OtherProcesses(UPSTREAM)
    first = await around.current()
    assert await around.current() is first
    monkeypatch.setattr(processes, "MAX_AGE_S", 0.0)
    assert await around.current() is not first
    assert await around.bound() is None
    warnings = [record for record in caplog.records if record.levelname == "WARNING"]
    assert len(warnings) == 1
    assert "is not among those readable here" in warnings[0].getMessage()
