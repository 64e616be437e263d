"""Ending what a server left behind: its process groups get SIGTERM, then SIGKILL after the grace."""

import subprocess
import sys
import time

from proxy.system.procfs import stat
from proxy.system.reaper import adopted, end_groups, own_child, reap
from tests.integration.polling import poll

IGNORES_TERM = "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True); time.sleep(60)"


def started(code: str) -> subprocess.Popen[bytes]:
    """A child in a process group of its own, running once it has printed a line."""
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True)
    assert child.stdout is not None
    child.stdout.readline()
    return child


def test_groups_end_on_sigterm_or_else_on_sigkill_and_nothing_stays_a_zombie() -> None:
    polite = started("import time; print(flush=True); time.sleep(60)")
    stubborn = started(IGNORES_TERM)
    children = [polite.pid, stubborn.pid]
    assert set(children) <= set(adopted())
    began = time.monotonic()
    end_groups(children, grace=0.5)
    assert 0.5 <= time.monotonic() - began < 10  # the stubborn one outlived the grace
    assert [stat(pid) for pid in children] == [None, None]  # ended and reaped
    for child in (polite, stubborn):
        assert child.stdout is not None
        child.stdout.close()
        child.wait()  # already reaped: Popen only learns it


def test_a_gone_process_is_skipped() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    child.wait()
    end_groups([child.pid], grace=0.1)


def a_zombie(child: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
    """`child`, once it has exited and waits to be reaped."""
    poll(lambda: True if (found := stat(child.pid)) and found.state == "Z" else None, what="exit", timeout=10)
    return child


def test_a_child_the_proxy_waits_on_itself_is_neither_adopted_nor_reaped() -> None:
    with own_child() as keep:
        child = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(7)"])
        keep(child.pid)
    a_zombie(child)
    assert child.pid not in adopted()
    reap([child.pid])
    assert child.wait() == 7  # its status is still there for its waiter


def test_a_child_started_while_one_is_being_started_is_taken_for_it() -> None:
    orphan = a_zombie(subprocess.Popen([sys.executable, "-c", "pass"]))
    time.sleep(0.03)  # a few clock ticks: start times are counted in them
    with own_child():
        starting = a_zombie(subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"]))
        assert orphan.pid in adopted()
        assert starting.pid not in adopted()
        reap([orphan.pid, starting.pid])
        assert stat(orphan.pid) is None
        assert starting.wait() == 3
    orphan.wait()  # already reaped: Popen only learns it
