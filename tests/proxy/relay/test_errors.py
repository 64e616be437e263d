"""The proxy's own errors: JSON a client can show, saying which upstream failed and why."""

import json

import aiohttp
import pytest
from aiohttp import web
from yarl import URL

from proxy.relay.answers import NotHttp
from proxy.relay.errors import NOT_HTTP, bad_gateway, gateway_timeout, reason_of, transfer_coding_refused

UPSTREAM = URL("http://127.0.0.1:4096")


def body(response: web.Response) -> dict[str, str]:
    assert response.content_type == "application/json"
    assert isinstance(response.body, bytes)
    parsed: dict[str, str] = json.loads(response.body)
    return parsed


@pytest.mark.parametrize(
    ("error", "reason"), [(ConnectionRefusedError("refused"), "refused"), (TimeoutError(), "TimeoutError")]
)
def test_bad_gateway_says_why_even_for_an_error_without_words(error: BaseException, reason: str) -> None:
    response = bad_gateway(UPSTREAM, error)
    assert response.status == 502
    assert body(response) == {
        "error": "bad_gateway",
        "message": f"upstream http://127.0.0.1:4096 is unreachable: {reason}",
        "upstream": "http://127.0.0.1:4096",
    }


def test_gateway_timeout_and_a_refused_coding() -> None:
    timed_out = gateway_timeout(UPSTREAM, 2.5)
    assert (timed_out.status, body(timed_out)["message"]) == (
        504,
        "upstream http://127.0.0.1:4096 did not answer within 2.5s",
    )
    refused = transfer_coding_refused("gzip, chunked")
    assert (refused.status, body(refused)["error"]) == (501, "not_implemented")


def test_a_parse_error_of_aiohttp_is_said_without_the_bytes_it_quotes() -> None:
    quoted = "Bad status line:\n  Expected HTTP/:\n\n  b'SSH-2.0-OpenSSH_9.2'\n    ^"
    error = aiohttp.ClientResponseError(None, (), status=400, message=quoted)  # type: ignore[arg-type]
    assert reason_of(error) == NOT_HTTP
    other = aiohttp.ClientResponseError(None, (), status=400, message="Invalid header value char:\n b'\\x01'")  # type: ignore[arg-type]
    assert reason_of(other) == "its answer is not HTTP: Invalid header value char"
    assert "SSH" not in str(body(bad_gateway(UPSTREAM, NotHttp("SSH-2.0"))))
