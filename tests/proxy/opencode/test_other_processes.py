"""Other processes on the upstream's database, surveyed from a fake `/proc` tree: who is the
upstream, which database it holds, who else holds it and since when, and why no bound can be given."""

import os
import socket
from contextlib import suppress
from pathlib import Path

import pytest
from yarl import URL

from proxy.opencode import other_processes as processes
from proxy.opencode.other_processes import START_MARGIN_MS, OtherProcess, Survey, accepting, survey
from tests.proxy.system.fake_proc import BOOT_S, DB, PORT, FakeProc

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
        OtherProcess(200, BOOT_S * 1000 + 50_000 - START_MARGIN_MS, "opencode serve", DB),
        OtherProcess(700, BOOT_S * 1000 + 40_000 - START_MARGIN_MS, "tui (x) y serve", DB),
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
    found = survey(URL(upstream), proc=proc.root, own_pid=1, accepts=lambda _: True)
    assert found.bound is None
    assert found.unknown is not None
    assert why in found.unknown
    assert not found.passing


def test_an_upstream_nothing_listens_on_yet_is_starting_not_elsewhere(proc: FakeProc) -> None:
    """A reading taken while the server starts (or restarts under `run`): nothing accepts on its
    port, so it is no other container's; the next survey knows."""
    proc.process(100, "socket:[111]", DB)
    asked: list[URL] = []
    upstream = URL(f"http://127.0.0.1:{PORT + 7}")

    def refuses(url: URL) -> bool:
        asked.append(url)
        return False

    found = survey(upstream, proc=proc.root, own_pid=1, accepts=refuses)
    assert asked == [upstream]
    assert (found.bound, found.unknown, found.passing) == (
        None,
        f"nothing listens on the upstream http://127.0.0.1:{PORT + 7} yet",
        True,
    )


def test_an_upstream_that_began_listening_during_the_survey_is_read_again(proc: FakeProc) -> None:
    proc.process(100, "socket:[111]", DB)
    upstream = URL(f"http://127.0.0.1:{PORT + 7}")

    def begins_listening(_: URL) -> bool:
        proc.listen(PORT + 7, "777")
        return True

    found = survey(upstream, proc=proc.root, own_pid=1, accepts=begins_listening)
    assert found.passing
    assert found.unknown is not None
    assert "began listening during the survey" in found.unknown


def test_accepting_is_whether_a_connection_is_accepted() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        assert accepting(URL(f"http://127.0.0.1:{port}"))
    assert not accepting(URL(f"http://127.0.0.1:{port}"))


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
    others = (OtherProcess(1, 5_000, "a", DB), OtherProcess(2, 3_000, "b", DB))
    assert Survey(10_000, others=others).bound == 3_000
    assert Survey(2_000, others=others).bound == 2_000
    assert Survey(10_000, unknown="why", others=others).bound is None


def test_the_real_proc_finds_this_process_listening() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        found = survey(URL(f"http://127.0.0.1:{server.getsockname()[1]}"), own_pid=1)
    assert found.upstream_pids == (os.getpid(),)
    assert found.unknown is not None
    assert "holds no opencode database" in found.unknown


def test_a_marked_process_shows_its_marker_in_its_fd_table() -> None:
    processes.mark_this_process()
    processes.mark_this_process()
    links = []
    for fd in os.listdir("/proc/self/fd"):
        with suppress(FileNotFoundError):  # the listing's own descriptor, closed by now
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
    assert links.count(f"/memfd:{processes.MARKER} (deleted)") == 1
