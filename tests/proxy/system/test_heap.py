"""The C heap keeps what one request frees for the next: bodies of a view's size, copied and all
freed as a request copies and frees them, fault no pages in once the thresholds are fixed (each run in a process of
its own, since the thresholds are the process's)."""

import ctypes
import subprocess
import sys

import pytest

from proxy.opencode.following import StreamListener
from proxy.opencode.global_events import GlobalEvent
from proxy.system import heap

CHURN = """
import resource, sys
from proxy.system.heap import keep_freed_bodies
kept = sys.argv[1] == "kept" and keep_freed_bodies()
def request():
    body = bytearray(601_000)
    body = bytes(body); body = bytes(body); body = bytes(body)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(300):
    request()
print(kept, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults(mode: str) -> tuple[bool, int]:
    out = subprocess.run([sys.executable, "-c", CHURN, mode], capture_output=True, text=True, check=True)
    kept, count = out.stdout.split()
    return kept == "True", int(count)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_bodies_freed_by_one_request_are_kept_for_the_next() -> None:
    untouched, faulted = faults("default")
    kept, kept_faults = faults("kept")
    assert not untouched
    assert kept
    assert faulted > 300 * 100  # every copy faults its pages in again: ~150 a copy
    assert kept_faults < faulted // 20


def test_another_c_library_is_left_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    class NoMallopt:
        def __init__(self, name: object) -> None:
            pass

    monkeypatch.setattr(ctypes, "CDLL", NoMallopt)
    assert heap.keep_freed_bodies() is False


GIVE_BACK = """
import sys
from proxy.system.heap import give_back_freed, keep_freed_bodies
keep_freed_bodies()
def rss_kib():
    (line,) = [l for l in open("/proc/self/status") if l.startswith("VmRSS:")]
    return int(line.split()[1])
bodies = [bytes(bytearray(601_000)) for _ in range(40)]  # a request's bodies, from the heap
pin = bytes(100)  # a small object above them, as the next request's leave one
del bodies
kept = rss_kib()
given = give_back_freed() if sys.argv[1] == "given" else False
print(given, kept - rss_kib())
"""


def freed_kib(mode: str) -> tuple[bool, int]:
    out = subprocess.run([sys.executable, "-c", GIVE_BACK, mode], capture_output=True, text=True, check=True)
    given, kib = out.stdout.split()
    return given == "True", int(kib)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_the_bodies_kept_for_the_next_request_are_given_back_when_asked() -> None:
    assert freed_kib("kept") == (False, 0)
    given, kib = freed_kib("given")
    assert given
    assert kib > 20_000  # of the ~23 MiB the bodies held


def test_a_restart_of_the_server_gives_the_free_heap_back(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []

    def give_back() -> bool:
        asked.append("trim")
        return True

    monkeypatch.setattr(heap, "give_back_freed", give_back)
    listener = heap.GiveBackOnRestart()
    assert isinstance(listener, StreamListener)
    listener.event(GlobalEvent("/cwd", None, "session.idle", {"sessionID": "ses_1"}))
    assert asked == []
    listener.following()
    assert asked == ["trim"]
