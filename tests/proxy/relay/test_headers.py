"""Header hygiene."""

import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from proxy import testing
from proxy.relay.headers import (
    client_response_headers,
    end_to_end,
    unsupported_transfer_coding,
    upstream_request_headers,
)


def test_hop_by_hop_and_connection_named_headers_are_dropped() -> None:
    headers = CIMultiDict(
        [("Connection", "close, X-Hop"), ("X-Hop", "1"), ("Keep-Alive", "5"), ("X-End", "2"), ("X-End", "3")]
    )
    assert list(end_to_end(headers, drop=("x-end",)).items()) == []
    assert list(end_to_end(headers).items()) == [("X-End", "2"), ("X-End", "3")]


def test_the_proxy_decides_the_framing_of_what_it_sends() -> None:
    upstream = CIMultiDictProxy(
        CIMultiDict({"Content-Length": "5", "Transfer-Encoding": "chunked", "ETag": "x"})
    )
    assert dict(client_response_headers(upstream)) == {"ETag": "x"}


def test_forwarded_headers_name_the_client_and_keep_its_host() -> None:
    flow = testing.flow("GET", "/x", headers={"Host": "example.test:8080", "X-Forwarded-For": "10.0.0.1"})
    headers = upstream_request_headers(flow.request)
    assert headers["Host"] == "example.test:8080"
    assert headers["X-Forwarded-For"].startswith("10.0.0.1, ")
    assert headers["X-Forwarded-Host"] == "example.test:8080"
    assert headers["X-Forwarded-Proto"] == "http"


@pytest.mark.parametrize(
    ("codings", "refused"),
    [
        (None, None),
        ("chunked", None),
        ("Chunked", None),
        ("gzip, chunked", "gzip, chunked"),
        ("gzip", "gzip"),
    ],
)
def test_only_plain_chunked_request_bodies_pass(codings: str | None, refused: str | None) -> None:
    flow = testing.flow("POST", "/x", headers={"Transfer-Encoding": codings} if codings else {})
    assert unsupported_transfer_coding(flow.request) == refused
