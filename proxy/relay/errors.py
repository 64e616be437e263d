"""Errors the proxy answers itself, always as JSON a client can show."""

from __future__ import annotations

from aiohttp import web
from yarl import URL


def bad_gateway(upstream: URL, error: BaseException) -> web.Response:
    """502 saying which upstream failed and why (the URL carries no credentials)."""
    reason = str(error) or type(error).__name__
    return web.json_response(
        {
            "error": "bad_gateway",
            "message": f"upstream {upstream} is unreachable: {reason}",
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
