"""`--auth`: the proxy's own HTTP Basic auth in front of everything it serves.

For an upstream without a password, or to guard the proxy's own routes. A request must
carry the configured credentials (header, or opencode's `?auth_token=base64(user:pass)`
for clients that cannot set headers, such as browsers opening an event stream). What the
client sent is forwarded unchanged, so with the same credentials as the server's
(`--auth opencode:$OPENCODE_SERVER_PASSWORD`) a client logs in once for both; the proxy
never substitutes credentials of its own.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable

from aiohttp import hdrs, web
from aiohttp.typedefs import Middleware

from proxy.opencode.client import AUTH_TOKEN_PARAM
from proxy.service.config import basic_authorization

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
REALM = 'Basic realm="settle-proxy"'


def require_basic_auth(username: str, password: str) -> Middleware:
    """A middleware that answers 401 unless the request carries these credentials."""
    expected = basic_authorization(username, password).encode()

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not _presented_matches(request, expected):
            return web.json_response(
                {"error": "unauthorized", "message": "settle-proxy requires HTTP Basic authentication"},
                status=401,
                headers={hdrs.WWW_AUTHENTICATE: REALM},
            )
        return await handler(request)

    return guard


def _presented_matches(request: web.Request, expected: bytes) -> bool:
    presented = request.headers.get(hdrs.AUTHORIZATION, "")
    if not presented and (token := request.query.get(AUTH_TOKEN_PARAM)):
        presented = "Basic " + token
    # Compared in constant time, so the answer's timing says nothing about the password.
    return hmac.compare_digest(presented.encode(), expected)


def parse_credentials(text: str) -> tuple[str, str]:
    """`user:password` → (user, password); the password may contain colons."""
    username, colon, password = text.partition(":")
    if not colon or not username or not password:
        raise ValueError("expected USER:PASSWORD")
    return username, password


__all__ = ["REALM", "parse_credentials", "require_basic_auth"]
