import pytest

from rules import (
    Api,
    Change,
    Liveness,
    Target,
    UnexpectedShape,
    apply_changes,
    changed_object,
    merge_patch,
    settle,
)


def test_merge_patch_replaces_in_place_appends_new_and_removes_null() -> None:
    merged = merge_patch(
        {"a": 1, "b": {"c": 2, "d": 3}, "e": 4}, {"b": {"c": 9, "z": 1}, "e": None, "f": [1]}
    )
    assert merged == {"a": 1, "b": {"c": 9, "d": 3, "z": 1}, "f": [1]}
    assert list(merged) == ["a", "b", "f"]
    assert list(merged["b"]) == ["c", "d", "z"]


def test_apply_changes_does_not_modify_its_input() -> None:
    original = {"parts": [{"x": 1}, {"y": {"z": 1}}]}
    change = Change("r", Target("m", "p"), {"y": {"z": 2}}, "why", ("parts", 1))
    changed = apply_changes(original, [change])
    assert original == {"parts": [{"x": 1}, {"y": {"z": 1}}]}
    assert changed == {"parts": [{"x": 1}, {"y": {"z": 2}}]}
    assert changed["parts"][0] is original["parts"][0]
    assert changed_object(changed, change) == {"y": {"z": 2}}


def test_engine_reports_unexpected_shapes() -> None:
    message = {"info": {"id": "m"}, "parts": [{"type": "tool", "state": {"status": "running"}}]}
    with pytest.raises(UnexpectedShape):
        settle(message, Api.V1, Liveness("s", active=False))


@pytest.mark.parametrize("junk", [None, 3, "x", [], {"parts": "no"}, {"parts": [1, None, {"state": 2}]}])
def test_engine_skips_what_has_no_open_tool(junk: object) -> None:
    assert settle(junk, Api.V1, Liveness("s", active=False)) is None
