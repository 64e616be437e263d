"""opencode 2.x's `Authorization` middleware, on every route of its API.

`packages/server/src/middleware/authorization.ts` `authorizationLayer` @13a9aa255669 (`@opencode/*`):
`?auth_token=<base64(user:pass)>` is read first, then `Authorization: Basic …`; a credential that does
not decode (bad base64, no `:`) is an empty one; failing both, a same-origin session cookie is tried. A
refusal is 401 with `www-authenticate: Basic realm="Secure Area"` and the `UnauthorizedError` body
(`protocol/src/errors.ts` @05428957b351). The user is `opencode` (`server/src/auth.ts` @605784f48417).
Every group of the API is behind it, `/api/health` and `/api/info` too (`protocol/src/api.ts`
`makeApiFromGroup` @01b3146925c0).
"""

from __future__ import annotations

import base64
import binascii
import secrets
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from aiohttp import web

from tests.opencode2.shapes import dumps, error_body

USERNAME = "opencode"
WWW_AUTHENTICATE = 'Basic realm="Secure Area"'
UNAUTHORIZED = error_body("UnauthorizedError", "Authentication required")


def basic(password: str, username: str = USERNAME) -> str:
    """The `Authorization` header value a 2.x client sends (`server/src/auth.ts` `header`)."""
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()


def auth_token(password: str, username: str = USERNAME) -> str:
    """The `auth_token` query value: the same base64 of `user:pass`."""
    return base64.b64encode(f"{username}:{password}".encode()).decode()


def _decode(value: str) -> tuple[str, str]:
    try:
        decoded = base64.b64decode(value, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return "", ""
    user, colon, password = decoded.partition(":")
    return (user, password) if colon else ("", "")


def _credential(request: web.Request) -> tuple[str, str]:
    token = request.query.get("auth_token")
    if token:
        return _decode(token)
    scheme, _, value = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "basic" and value.strip():
        return _decode(value.strip())
    return "", ""


@dataclass
class Auth:
    """The password a server process holds and the session cookies it issued."""

    password: str
    sessions: set[str] = field(default_factory=set)

    def cookie_name(self, port: int) -> str:
        """`ServerAuth.sessionCookieName(host)`; named `opencode_session_<port>` per
        ../shared/OPENCODE.md (the helper itself was not found in the commits read)."""
        return f"opencode_session_{port}"

    def issue_session(self) -> str:
        token = secrets.token_urlsafe(16)
        self.sessions.add(token)
        return token

    def allows(self, request: web.Request, port: int) -> bool:
        user, password = _credential(request)
        if user == USERNAME and password == self.password:
            return True
        token = request.cookies.get(self.cookie_name(port))
        if not token:
            return False
        origin = request.headers.get("Origin")
        if origin is not None and urlsplit(origin).netloc != request.headers.get("Host"):
            return False
        return token in self.sessions


def refusal() -> web.Response:
    return web.json_response(
        dumps=dumps, data=UNAUTHORIZED, status=401, headers={"www-authenticate": WWW_AUTHENTICATE}
    )
