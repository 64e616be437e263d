"""Latency in pairs: the rotation of each round's order, the paired differences and their figures."""

from collections import Counter

import pytest

from bench.pairs import cpu_ms_per_request, differences, figures, rotated
from bench.real_pairs import PairedRun
from bench.real_report import pairs_table


def test_each_path_takes_each_place_equally_often_over_as_many_rounds_as_paths() -> None:
    paths = ["direct", "nginx", "proxy"]
    orders = [rotated(paths, number) for number in range(6)]
    assert orders[:3] == [paths, ["nginx", "proxy", "direct"], ["proxy", "direct", "nginx"]]
    assert orders[3:] == orders[:3]
    for place in range(3):
        assert Counter(order[place] for order in orders) == Counter(dict.fromkeys(paths, 2))


def test_differences_pair_each_round_with_its_own_direct_request() -> None:
    """A server that slows down between rounds moves both requests of a round alike: the hop's
    added time stays what it is, which a comparison of sorted or pooled times would not show."""
    direct = [10.0, 30.0, 20.0]
    hop = [11.0, 30.5, 22.0]
    assert differences({"direct": direct, "proxy": hop}, "proxy") == [1.0, 0.5, 2.0]
    with pytest.raises(ValueError, match="zip"):
        differences({"direct": direct, "proxy": hop[:2]}, "proxy")


def test_figures_give_each_path_its_percentiles_and_each_hop_what_it_adds() -> None:
    direct = [float(n) for n in range(10, 110)]  # 100 rounds, 10..109 ms
    hop = [ms + (3.0 if n < 90 else 10.0) for n, ms in enumerate(direct)]
    base, added = figures({"direct": direct, "proxy": hop}, {"proxy": 0.5})
    assert (base.p50_ms, base.p99_ms) == (59.0, 108.0)
    assert base.added_median_ms is None
    assert base.cpu_ms_per_request is None
    assert added.added_median_ms == 3.0
    assert added.added_p90_ms == 3.0  # the 90th of 100 sorted differences; the 91st is 10
    assert added.cpu_ms_per_request == 0.5
    (shifted,) = figures({"direct": direct, "proxy": [ms + 3.0 for ms in direct]}, {})[1:]
    assert shifted.p50_ms == base.p50_ms + 3.0


def test_cpu_per_request_is_the_ticks_between_readings_over_the_requests_served() -> None:
    assert cpu_ms_per_request(1_000, 1_040, 100, 400) == 1.0
    with pytest.raises(ValueError, match="no request"):
        cpu_ms_per_request(0, 0, 100, 0)


def test_the_table_puts_the_proxys_added_latency_beside_nginxs_and_the_relays() -> None:
    direct = [20.0, 22.0, 21.0, 25.0]
    run = PairedRun(
        {
            "direct": direct,
            "relay": [ms + 1.0 for ms in direct],
            "nginx": [ms + 2.0 for ms in direct],
            "proxy": [ms + 2.5 for ms in direct],
        },
        {"relay": 0.5, "nginx": 0.2, "proxy": 1.25},
    )
    lines = {line.split(" | ")[1]: line for line in pairs_table({"v1-list-clean": run}).splitlines()[2:]}
    assert lines["direct"] == "| v1-list-clean | direct | 4 | 21.0 | 25.0 | - | - | - | - | - |"
    assert lines["nginx"] == "| v1-list-clean | nginx | 4 | 23.0 | 27.0 | +2.00 | +2.00 | - | - | 0.200 |"
    assert lines["proxy"] == (
        "| v1-list-clean | proxy | 4 | 23.5 | 27.5 | +2.50 | +2.50 | +0.500 / +0.500 | +1.50 / +1.50 | 1.25 |"
    )
