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
