"""The memory soak's report: the growth after the warm-up is read against round 10, at its most."""

from __future__ import annotations

from bench.soak_memory import FLAT_KIB, Growth, report


def test_growth_is_the_most_any_later_round_is_above_round_ten() -> None:
    warm_up = [50_000 + 1_000 * n for n in range(10)]  # grows 9 MiB while it warms: not counted
    later = [59_500, 61_000, 58_000, 60_000]
    growth = Growth((*warm_up, *later))
    assert growth.base_kib == 59_000
    assert growth.growth_kib == 2_000
    assert growth.last_kib == 1_000
    assert growth.flat
    text = report(growth)
    assert "growth after round 10: +2.0 MiB at most (the last round +1.0 MiB), over 4 rounds" in text
    assert "flat within 5 MiB" in text


def test_a_round_past_five_mib_above_round_ten_is_not_flat() -> None:
    growth = Growth((*[40_000] * 10, 40_000 + FLAT_KIB, 40_000 + FLAT_KIB + 1, 40_000))
    assert growth.growth_kib == FLAT_KIB + 1
    assert growth.last_kib == 0
    assert not growth.flat
    assert "NOT flat" in report(growth)


def test_a_shrinking_proxy_is_flat() -> None:
    growth = Growth((*[40_000] * 10, 39_000, 38_000))
    assert growth.growth_kib == -1_000
    assert growth.flat


def test_each_round_is_listed_and_too_few_rounds_are_said() -> None:
    text = report(Growth((10_240, 20_480)))
    assert text.splitlines()[:2] == ["round   1:    10.0 MiB", "round   2:    20.0 MiB"]
    assert text.splitlines()[-1] == "growth after round 10: not measured (2 rounds)"


def test_open_files_are_listed_with_each_round_and_compared_after_round_ten() -> None:
    text = report(Growth((*[40_000] * 11,), fds=(*[30] * 10, 31)))
    assert text.splitlines()[0] == "round   1:    39.1 MiB,   30 open files"
    assert "open files: 30 after round 10, 31 after the last" in text
