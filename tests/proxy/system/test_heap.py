"""The C heap keeps what one request frees for the next: bodies of a view's size, copied and all
freed as a request copies and frees them, fault no pages in once the thresholds are fixed (each run in a process of
its own, since the thresholds are the process's)."""

import ctypes
import subprocess
import sys

import pytest

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


HOLES = """
from proxy.system.heap import give_back_free_pages, keep_freed_bodies
def rss_kib():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1])
keep_freed_bodies()
survivors, bodies = [], []
for n in range(20_000):
    bodies.append(bytes(2_000 + n % 7_000))
    if n % 10 == 0:
        survivors.append(bytes(700))
bodies.clear()
before = rss_kib()
print(give_back_free_pages(), before, rss_kib())
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


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_free_pages_between_survivors_are_given_back() -> None:
    """Bodies freed around long-lived objects stay resident under the kept thresholds until the
    heap's free pages are given back."""
    out = subprocess.run([sys.executable, "-c", HOLES], capture_output=True, text=True, check=True)
    given, before, after = out.stdout.split()
    assert given == "True"
    assert int(before) - int(after) > 50 * 1024  # ~90 MB of bodies freed, in holes


async def test_giving_back_ends_at_once_without_glibc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heap, "_malloc_trim", lambda: None)
    assert heap.give_back_free_pages() is False
    await heap.give_back_every(0)


def test_another_c_library_is_left_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    class NoMallopt:
        def __init__(self, name: object) -> None:
            pass

    monkeypatch.setattr(ctypes, "CDLL", NoMallopt)
    assert heap.keep_freed_bodies() is False
