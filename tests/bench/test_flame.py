"""The flame graph writer: stacks in the collapsed format, and frames as wide as their samples."""

import re
from collections import Counter

from bench.flame import Stack, collapsed, svg


def test_collapsed_stacks_and_widths_follow_the_samples() -> None:
    stacks: Counter[Stack] = Counter({("main", "forward", "copy"): 3, ("main", "forward"): 1})
    assert collapsed(stacks) == "main;forward 1\nmain;forward;copy 3\n"
    graph = svg(stacks, "t")
    widths = {name: float(w) for name, w in re.findall(r"<title>(\w+) \(.*?width=\"([\d.]+)\"", graph)}
    assert widths["main"] == widths["forward"] == 1800.0
    assert widths["copy"] == 1350.0
