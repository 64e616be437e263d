"""The one bounded mapping the proxy keeps per-session and per-view state in."""

import pytest

from proxy.relay.bounded import Bounded


def test_the_least_recently_set_or_read_is_forgotten_first() -> None:
    kept: Bounded[str, int] = Bounded(2)
    kept["a"], kept["b"] = 1, 2
    assert kept["a"] == 1  # now the most recent
    kept["c"] = 3
    assert dict(kept.items()) == {"a": 1, "c": 3}
    assert kept.get("b") is None
    kept["a"] = 4  # set again: the most recent, not a new entry
    kept["d"] = 5
    assert list(kept) == ["a", "d"]


def test_it_never_holds_more_than_its_capacity() -> None:
    kept: Bounded[int, None] = Bounded(100)
    for key in range(10_000):
        kept.setdefault(key, None)
    assert len(kept) == 100
    assert list(kept) == list(range(9_900, 10_000))


def test_iterating_asking_for_a_key_and_peeking_refresh_nothing() -> None:
    kept: Bounded[str, int] = Bounded(3)
    kept.update(a=1, b=2, c=3)
    assert [value for key, value in kept.items() if key in kept] == [1, 2, 3]
    assert list(kept.values()) == [1, 2, 3]
    assert (kept.peek("a"), kept.peek("z")) == (1, None)
    kept["d"] = 4
    assert list(kept) == ["b", "c", "d"], "the oldest set went, however often it was iterated over"
    assert kept.pop("b") == 2
    assert "b" not in kept


def test_each_entry_forgotten_for_room_is_handed_over() -> None:
    handed: list[tuple[str, int]] = []
    kept: Bounded[str, int] = Bounded(2, forgotten=lambda key, value: handed.append((key, value)))
    kept.update(a=1, b=2, c=3)
    del kept["b"]
    kept["d"] = 4
    assert handed == [("a", 1)], "an entry deleted is not forgotten, and room was left"
    kept["e"] = 5
    assert handed == [("a", 1), ("c", 3)]


def test_a_capacity_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Bounded[str, int](0)
