"""opencode-format ids: ascending, in the server's shape."""

import re

from proxy.opencode.ids import ascending_id


def test_ids_ascend_even_within_one_millisecond() -> None:
    ids = [ascending_id("evt", now_ms=1_700_000_000_000) for _ in range(50)]
    assert ids == sorted(ids)
    assert len(set(ids)) == 50
    assert ascending_id("evt", now_ms=1_700_000_000_000 - 5_000) > ids[-1]  # a clock stepped back


def test_the_shape_is_opencodes() -> None:
    made = ascending_id("prt", now_ms=1_700_000_000_000)
    assert re.fullmatch(r"prt_[0-9a-f]{12}[0-9A-Za-z]{14}", made)
