"""Errors the proxy answers itself, always as JSON a client can show."""

from __future__ import annotations

import ssl

import aiohttp
from aiohttp import web
from yarl import URL

from proxy.relay.answers import NotHttp

NOT_AN_ANSWER = "what it sent does not begin as an HTTP answer (is the URL opencode's?)"
NOT_HTTP = f"it is not an HTTP server: {NOT_AN_ANSWER}"
PLAIN_HTTP = (
    "it answers in plain HTTP, not TLS ([SSL: WRONG_VERSION_NUMBER]): give the proxy the same "
    "address with http://, not https://"
)
NAMELESS = frozenset({NOT_HTTP, PLAIN_HTTP})
"""The reasons that name nothing of the upstream (neither its address nor its bytes): what the
proxy may say to a client it shows nothing else."""


def reason_of(error: BaseException) -> str:
    """Why a request upstream failed, in words that never repeat the upstream's bytes: aiohttp's
    parse errors quote them (an SSH port's banner), so only their first line is kept."""
    if _plain_http(error):
        return PLAIN_HTTP
    if isinstance(error, aiohttp.ClientResponseError):  # raised by the parser: no status is read
        first = error.message.splitlines()[0] if error.message else type(error).__name__
        return NOT_HTTP if "status line" in first.lower() else f"its answer is not HTTP: {first.rstrip(':')}"
    if isinstance(error, NotHttp):
        return NOT_HTTP
    return str(error) or type(error).__name__


def _plain_http(error: BaseException) -> bool:
    """An `https://` upstream that answered in plain HTTP: OpenSSL reads the status line as a TLS
    record of a version it does not know (the relay's error has it as its cause, aiohttp's as its
    `os_error`)."""
    for cause in (error, getattr(error, "os_error", None), error.__cause__):
        if isinstance(cause, ssl.SSLError) and getattr(cause, "reason", None) == "WRONG_VERSION_NUMBER":
            return True
    return False


def bad_gateway(upstream: URL, error: BaseException) -> web.Response:
    """502 saying which upstream failed and why (the URL carries no credentials)."""
    not_http = isinstance(error, NotHttp)
    said = f"is not an HTTP server: {NOT_AN_ANSWER}" if not_http else f"is unreachable: {reason_of(error)}"
    return web.json_response(
        {
            "error": "bad_gateway",
            "message": f"upstream {upstream} {said}",
            "upstream": str(upstream),
        },
        status=502,
    )


def gateway_timeout(upstream: URL, seconds: float) -> web.Response:
    """504: the upstream took longer than the response timeout, so the client is not kept waiting."""
    return web.json_response(
        {
            "error": "gateway_timeout",
            "message": f"upstream {upstream} did not answer within {seconds:g}s",
            "upstream": str(upstream),
        },
        status=504,
    )


def transfer_coding_refused(codings: str) -> web.Response:
    """501 for a request body in a transfer coding the proxy cannot pass on faithfully."""
    return web.json_response(
        {
            "error": "not_implemented",
            "message": f"transfer coding {codings!r} is not supported: send it chunked or with a length",
        },
        status=501,
    )
