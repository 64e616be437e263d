"""Who may reach what: `--auth`, the proxy's own HTTP Basic auth in front of everything it
serves, and `DetailsGuard`, which keeps the proxy's own routes (`/_settle/*`) behind the
upstream's password.

For an upstream without a password, or to guard the proxy's own routes. A request must
carry the configured credentials (header, or opencode's `?auth_token=base64(user:pass)`
for clients that cannot set headers, such as browsers opening an event stream). What the
client sent is forwarded unchanged, so with the same credentials as the server's
(`--auth opencode:$OPENCODE_SERVER_PASSWORD`) a client logs in once for both; the proxy
never substitutes credentials of its own.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import re
from collections.abc import Awaitable, Callable
from typing import NamedTuple

from aiohttp import hdrs, web
from aiohttp.typedefs import Middleware

from proxy.opencode.client import AUTH_TOKEN_PARAM, basic_as
from proxy.opencode.tracker import StreamListener

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Lookup(NamedTuple):
    """How the upstream answered the proxy's own look-up, made with the proxy's credentials if it
    has any: its status, or (None) why it could not be reached, when that names nothing of the
    upstream (neither its address nor its bytes), so that a refusal may say it."""

    status: int | None
    unreachable: str | None = None


UpstreamCheck = Callable[[web.Request], Awaitable[Lookup]]
REALM = 'Basic realm="settle-proxy"'


def require_basic_auth(username: str, password: str) -> Middleware:
    """A middleware that answers 401 unless the request carries these credentials."""
    expected = f"{username}:{password}".encode()

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


class DetailsGuard(StreamListener):
    """Keeps what the proxy knows about itself and the server (health, metrics, orphans) from
    anyone the server itself would refuse.

    Whom the server lets through is learnt from its answer to the proxy's own look-up (a reading at
    most a second old, made with the proxy's credentials if it has any) or its event stream; the
    last answer stands while the upstream cannot be reached. With the upstream's credentials
    configured (`OPENCODE_SERVER_PASSWORD`), a request must present them, as Basic or as
    `?auth_token=`; they are checked here, in constant time, and never sent upstream. Once the
    server refuses them they admit no one, until it lets them through again: whoever presents them
    would be shown what the server refuses them, and without them the server's own cannot be
    checked. Without them the proxy cannot check anything: it shows its details only while the
    upstream lets a request without credentials through (nothing before its first answer). Behind
    `--auth` the proxy's own login, checked on every route, suffices.
    """

    def __init__(
        self,
        authorization: str | None,
        check: UpstreamCheck,
        *,
        behind_own_auth: bool,
        user: Callable[[], str | None] = lambda: None,
    ) -> None:
        self._authorization = authorization
        self._expected = basic_credentials(authorization) if authorization else None
        if authorization and self._expected is None:
            raise ValueError("the upstream's credentials are HTTP Basic, as opencode's are")
        self._user = user
        """The user the upstream's line always takes (2.x: `opencode`), which is then what its
        clients present, whatever user the proxy was configured with."""
        self._check = check
        self._behind_own_auth = behind_own_auth
        self._lets_through: bool | None = None
        """Whether the upstream's last answer to the proxy's own look-up (with its credentials, if
        it has any) let it through."""

    def following(self) -> None:
        """The proxy's own event stream, asked with its own credentials (or none), was let through:
        an answer of the upstream that stands while it cannot be reached (a crash before anyone
        asked for details)."""
        self._lets_through = True

    def guard(self, handler: Handler) -> Handler:
        """`handler`, answered only for whom the guard admits."""

        async def guarded(request: web.Request) -> web.StreamResponse:
            return await self._refusal(request) or await handler(request)

        return guarded

    async def _refusal(self, request: web.Request) -> web.Response | None:
        if self._behind_own_auth:
            return None
        if (lookup := await self._check(request)).status is not None:
            self._lets_through = lookup.status != web.HTTPUnauthorized.status_code
        expected, authorization = self._expected, self._authorization
        if self._lets_through is False:
            return _refuse(403, "forbidden", _NOTHING_TO_CHECK if expected is None else _OWN_REFUSED)
        if expected is None or authorization is None:
            return None if self._lets_through else _refuse(503, "unknown", _unknown(lookup))
        expected = basic_credentials(basic_as(authorization, self._user())) or expected
        if _presented_matches(request, expected):
            return None
        if not _presents_any(request):
            return _refuse(401, "unauthorized", _NONE_PRESENTED)
        return _refuse(401, "unauthorized", _NOT_THE_SERVERS if self._lets_through else _OTHERS)


def _unknown(lookup: Lookup) -> str:
    said = "the upstream has not answered yet: whether it requires credentials is unknown"
    return f"{said}; {lookup.unreachable}" if lookup.unreachable else said


_NOTHING_TO_CHECK = (
    "the upstream requires credentials and the proxy has none to check them against: give it the "
    "server's in OPENCODE_SERVER_PASSWORD (on 2.x OPENCODE_PASSWORD) and OPENCODE_SERVER_USERNAME, "
    "or log in to it with --auth"
)
_OWN_REFUSED = (
    "the server refuses the proxy's credentials, so none are admitted here (whoever presents them "
    "would be shown what the server refuses them, and the server's own cannot be checked): set "
    "OPENCODE_SERVER_PASSWORD (on 2.x OPENCODE_PASSWORD) to the server's, and OPENCODE_SERVER_USERNAME "
    "if its user is not opencode; or log in to the proxy with --auth"
)
_NONE_PRESENTED = "the upstream requires credentials: present the server's, as Basic or as ?auth_token="
_NOT_THE_SERVERS = "these are not the server's credentials: present the server's, as Basic or as ?auth_token="
_OTHERS = (
    "these are not the credentials the proxy was given for the server; if they are the server's, the "
    "proxy's are wrong: set OPENCODE_SERVER_PASSWORD (on 2.x OPENCODE_PASSWORD) and OPENCODE_SERVER_USERNAME "
    "to the server's"
)


def _presents_any(request: web.Request) -> bool:
    return hdrs.AUTHORIZATION in request.headers or AUTH_TOKEN_PARAM in request.query


def _refuse(status: int, error: str, message: str) -> web.Response:
    headers = {hdrs.WWW_AUTHENTICATE: REALM} if status == web.HTTPUnauthorized.status_code else {}
    return web.json_response({"error": error, "message": message}, status=status, headers=headers)


_BASIC = re.compile(r" *basic +([A-Za-z0-9._~+/-]+=*) *", re.IGNORECASE | re.ASCII)
"""HTTP Basic as opencode reads it: the scheme in any case (RFC 9110 §11.1), spaces around."""
_TOKEN = re.compile(r"[A-Za-z0-9._~+/-]+=*", re.ASCII)


def basic_credentials(authorization: str) -> bytes | None:
    """The `user:password` bytes of a Basic `Authorization` value; None for anything else, a
    header with a byte that is not UTF-8 (aiohttp hands it on surrogate-escaped) included."""
    if (basic := _BASIC.fullmatch(authorization)) is None:
        return None
    return _decoded(basic.group(1))


def _decoded(token: str) -> bytes | None:
    if _TOKEN.fullmatch(token) is None:
        return None
    try:
        return base64.b64decode(token, validate=True)
    except binascii.Error:
        return None


def _presented_matches(request: web.Request, expected: bytes) -> bool:
    """Whether the request presents `expected` (`user:password`), as Basic or, without an
    `Authorization` header, as `?auth_token=`; anything unreadable is simply not a match."""
    if presented := request.headers.get(hdrs.AUTHORIZATION, ""):
        credentials = basic_credentials(presented)
    else:
        credentials = _decoded(request.query.get(AUTH_TOKEN_PARAM, ""))
    # Compared in constant time, so the answer's timing says nothing about the password.
    return credentials is not None and hmac.compare_digest(credentials, expected)


__all__ = [
    "REALM",
    "DetailsGuard",
    "Handler",
    "Lookup",
    "UpstreamCheck",
    "basic_credentials",
    "require_basic_auth",
]
