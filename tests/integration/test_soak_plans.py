"""The soak's rounds follow from their seeds alone, so a failing round's printed seed replays it,
and any three rounds in a row deal every kind (no server needed)."""

from __future__ import annotations

import pytest

from .soak import DECK, ROUNDS_VARIABLE, SEED_VARIABLE, round_plan, soak_plans


def test_a_rounds_seed_alone_decides_it() -> None:
    assert round_plan(7, 1234, watched=False) == round_plan(7, 1234, watched=False)
    replayed = round_plan(0, 1234, watched=True)
    soaked = round_plan(5, 1234, watched=True)
    assert (replayed.kind, replayed.moment, replayed.after_restart, replayed.continuation) == (
        soaked.kind,
        soaked.moment,
        soaked.after_restart,
        soaked.continuation,
    )
    assert f"{SEED_VARIABLE}=1234" in soaked.describe()


def test_three_rounds_in_a_row_deal_every_kind_and_each_kind_kills_as_it_says() -> None:
    for first in range(20):
        plans = [round_plan(n, first + n, watched=False) for n in range(3)]
        assert sorted(plan.kind for plan in plans) == sorted(DECK)
        for plan in plans:
            assert plan.resumed == (plan.kind != "proxy")
            assert plan.kind != "after-restart" or plan.after_restart
            assert plan.kind != "continuation" or plan.continuation
            assert plan.kind != "proxy" or not (plan.after_restart or plan.continuation)


def test_the_soak_takes_its_rounds_and_seed_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ROUNDS_VARIABLE, "4")
    monkeypatch.setenv(SEED_VARIABLE, "40")
    plans = soak_plans()
    assert [plan.seed for plan in plans] == [40, 41, 42, 43]
    assert [plan.watched for plan in plans] == [True, False, False, True]
