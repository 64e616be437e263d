"""What a client must get from the proxy for whatever the upstream answers: the answer unchanged
unless a rule applies, and when one applies exactly what `rules.settle_view` makes of it.

Shared by the bad-input properties (`test_bad_answers`, `test_generated_views`): the routes they
ask, how many examples they run and what the rules make of a body.
"""

from __future__ import annotations

from collections import Counter

import orjson
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from proxy.addons.settle import SETTLED_HEADER
from rules import Api, Liveness, UnexpectedShape, ViewSettlement, settle_view
from tests.fixtures import OPENCODE
from tests.reliability.background import Answer

SESSION = "ses_fuzz"
MESSAGE_ROUTES = {
    (Api.V2, False): f"/api/session/{SESSION}/message",
    (Api.V2, True): f"/api/session/{SESSION}/message/msg_fuzz",
    (Api.V1, False): f"/session/{SESSION}/message",
    (Api.V1, True): f"/session/{SESSION}/message/msg_fuzz",
}
PLAIN_ROUTE = "/config"
CAPTURES = sorted(path.name for path in OPENCODE.glob("*.json"))
ACTIVE = st.sampled_from([False, False, False, True])
"""Whether the upstream says the session runs: mostly not, so that rules get to apply."""
EXAMPLES = 300
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CASES: Counter[str] = Counter()
"""What the examples were, printed when a module's rig stops: a property that never settles
anything would pass without showing it."""


def settlement_of(body: bytes, api: Api, single: bool, active: bool) -> ViewSettlement | None:
    """What the rules make of `body` as a view of `SESSION`; None when nothing applies."""
    try:
        return settle_view(orjson.loads(body), api, Liveness(SESSION, active), single=single)
    except (orjson.JSONDecodeError, UnexpectedShape):
        return None


def assert_unchanged(answer: Answer, status: int, body: bytes) -> None:
    assert answer.status == status
    assert answer.body == body, f"body changed: {body[:120]!r} -> {answer.body[:120]!r}"
    assert SETTLED_HEADER.lower() not in answer.headers


def settled_tools(view: ViewSettlement) -> int:
    """How many tool parts the rules settled (the other changes close their messages)."""
    return sum(1 for change in view.changes if change.path[:1] in (("parts",), ("content",)))


def assert_settled(answer: Answer, view: ViewSettlement) -> None:
    assert answer.status == 200
    assert orjson.loads(answer.body) == view.document
    assert answer.headers[SETTLED_HEADER.lower()] == str(settled_tools(view))
