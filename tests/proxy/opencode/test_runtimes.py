"""Each runtime's routes: its message views, its message paths and its liveness request."""

from proxy.opencode.dialects import LINE_1_18
from proxy.opencode.routes import MessageRoute, match_message_route
from proxy.opencode.runtimes import V1_HTTP, V2_HTTP
from rules import V1, V2, Api


def test_one_http_runtime_per_api_on_top_of_the_rules_one() -> None:
    assert LINE_1_18.runtimes == {Api.V1: V1_HTTP, Api.V2: V2_HTTP}
    assert (V1_HTTP.rules, V2_HTTP.rules) == (V1, V2)
    assert (V1_HTTP.liveness_path, V2_HTTP.liveness_path) == ("/session/status", "/api/session/active")


def test_message_paths_match_the_views() -> None:
    for runtime in LINE_1_18.runtimes.values():
        assert match_message_route("GET", runtime.messages_path("ses")) == MessageRoute(
            runtime.api, "ses", False
        )
        assert match_message_route("GET", runtime.messages_path("ses", "msg")) == MessageRoute(
            runtime.api, "ses", True
        )
    assert V1_HTTP.messages_path("s", "m") == "/session/s/message/m"
    assert V2_HTTP.messages_path("s") == "/api/session/s/message"
    assert match_message_route("GET", "/api/session/s/context") == MessageRoute(Api.V2, "s", False)
    assert match_message_route("POST", "/session/s/message") is None
