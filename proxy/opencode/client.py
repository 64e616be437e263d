"""JSON calls the proxy makes to the upstream on its own behalf (liveness, write-back).

They carry the credentials of the client they serve (or the configured ones), never a
cookie, and always ask for an uncompressed answer, since the session never decompresses.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from http import HTTPStatus
from typing import Any

import aiohttp
from aiohttp import hdrs, web
from yarl import URL

from proxy.opencode import jsonio

AUTH_TOKEN_PARAM = "auth_token"


class UpstreamRefused(RuntimeError):
    """The upstream answered, but not with the success the call needs."""

    def __init__(self, method: str, path: str, status: int, body: bytes) -> None:
        super().__init__(f"{method} {path}: HTTP {status} {body[:200]!r}")
        self.asked = f"{method} {path}"
        """What was asked: `GET /session/ses_1/message`."""
        self.status = status
        self.reason, self.explained = _reason(status, body)
        """The answer's own word for it, short: its error's `_tag`, `name` or `message`, else the
        status's phrase (`not found`); `explained` says which."""

    @property
    def no_route(self) -> bool:
        """A 404 that names no error of its own: the server has no such route (2.1.2 answers an
        unknown route with an empty 404, an unknown session with `SessionNotFoundError`)."""
        return self.status == HTTPStatus.NOT_FOUND and not self.explained


def _reason(status: int, body: bytes) -> tuple[str, bool]:
    try:
        said = jsonio.loads(body) if body else None
    except Exception:  # whatever the decoder refuses: the status says it
        said = None
    if isinstance(said, dict):
        for key in ("_tag", "name", "message"):
            if isinstance(word := said.get(key), str) and word:
                return word[:80], True
    try:
        return HTTPStatus(status).phrase.lower(), False
    except ValueError:
        return "no reason given", False


@dataclass(frozen=True, slots=True)
class Credentials:
    """How a call authenticates: the client's own header or token, else the configured ones."""

    headers: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    own: bool = False
    """The proxy's configured credentials, not a client's: only these are re-made for a line
    whose user is fixed (`as_user`); a client's are sent as the client sent them."""

    @classmethod
    def for_request(cls, request: web.Request, fallback: str | None) -> Credentials:
        if authorization := request.headers.get(hdrs.AUTHORIZATION):
            return cls(headers={hdrs.AUTHORIZATION: authorization})
        if token := request.query.get(AUTH_TOKEN_PARAM):
            return cls(params={AUTH_TOKEN_PARAM: token})
        return cls.configured(fallback)

    @classmethod
    def configured(cls, authorization: str | None) -> Credentials:
        return cls(headers={hdrs.AUTHORIZATION: authorization}, own=True) if authorization else cls()

    def as_user(self, username: str | None) -> Credentials:
        """These credentials for a server whose user is always `username` (2.x's is `opencode`,
        whatever OPENCODE_SERVER_USERNAME, 1.x's, says); None (a line whose user is configured)
        and a client's own credentials are kept as they are."""
        authorization = self.headers.get(hdrs.AUTHORIZATION)
        if username is None or not self.own or authorization is None:
            return self
        return replace(self, headers={**self.headers, hdrs.AUTHORIZATION: basic_as(authorization, username)})


def basic_as(authorization: str, username: str | None) -> str:
    """A Basic `authorization` with its password under `username` (None: as it is); anything that
    is not Basic is kept as it is."""
    scheme, _, token = authorization.strip().partition(" ")
    if username is None or scheme.lower() != "basic":
        return authorization
    try:
        _, colon, password = base64.b64decode(token.strip(), validate=True).partition(b":")
    except (binascii.Error, ValueError):
        return authorization
    if not colon:
        return authorization
    return "Basic " + base64.b64encode(username.encode() + b":" + password).decode("ascii")


def password_fix(credentials: Credentials) -> str:
    """What to do about a server that answered 401 to `credentials`, in its variables' names
    (2.x reads OPENCODE_PASSWORD first, 1.x OPENCODE_SERVER_PASSWORD; the proxy reads both)."""
    fix = (
        "set OPENCODE_SERVER_PASSWORD (on 2.x OPENCODE_PASSWORD) to the server's, and "
        "OPENCODE_SERVER_USERNAME if its user is not opencode"
    )
    if credentials.headers or credentials.params:
        return f"the server refused the password presented: {fix}"
    return f"the server wants a password and the proxy has none: {fix}"


@dataclass(frozen=True, slots=True)
class Answer:
    """An answer as it came, for a caller that must say why it is not the one it needs."""

    status: int
    content_type: str
    body: bytes
    retry_after: str | None


CALL_TIMEOUT_S = 60.0
"""The longest one of the proxy's own calls may take: the session they share also carries
`/global/event`, so it has no total of its own, and a call held for good by a server that is
starting would hold whatever waits on it (a write-back pass and its session lock) as long."""


class UpstreamApi:
    """A thin JSON client over the application's one upstream session, to the server at `origin`
    (only its scheme, host and port count)."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        origin: URL,
        *,
        user: Callable[[], str | None] = lambda: None,
    ) -> None:
        self._session = session
        self._origin = origin.origin()
        self._user = user
        """The user the server's line always takes, if it fixes one (`ServerLine.user`)."""
        shared = session.timeout
        self._timeout = aiohttp.ClientTimeout(
            total=CALL_TIMEOUT_S,
            connect=shared.connect,
            sock_connect=shared.sock_connect,
            sock_read=shared.sock_read,
        )

    async def call(
        self,
        method: str,
        path: str,
        credentials: Credentials,
        *,
        params: dict[str, str] | None = None,
        json: Any = None,
        parse: Callable[[bytes], Any] = jsonio.loads,
    ) -> Any:
        """Send one request and return the 200 answer, parsed by `parse`; anything else raises."""
        answer, _ = await self._send(method, path, credentials, params or {}, json, parse=parse)
        return answer

    async def get(self, path: str, credentials: Credentials, **params: str) -> Any:
        """`GET path?params`, parsed."""
        return await self.call("GET", path, credentials, params=params)

    async def answer(self, path: str, credentials: Credentials) -> Answer:
        """`GET path`, whatever it answers (a body past 64 KiB is cut: an answer that long is not
        the small JSON object asked for)."""
        headers = {**credentials.as_user(self._user()).headers, hdrs.ACCEPT_ENCODING: "identity"}
        url = self._origin.with_path(path)
        async with self._session.get(
            url.with_query(credentials.params) if credentials.params else url,
            headers=headers,
            allow_redirects=False,
            timeout=self._timeout,
        ) as response:
            return Answer(
                response.status,
                response.content_type,
                await response.content.read(2**16),
                response.headers.get(hdrs.RETRY_AFTER),
            )

    async def dated_get(self, path: str, credentials: Credentials, **params: str) -> tuple[Any, str | None]:
        """`GET path?params`, parsed, with the answer's `Date` header (the server's clock)."""
        return await self._send("GET", path, credentials, params, None)

    async def _send(
        self,
        method: str,
        path: str,
        credentials: Credentials,
        params: dict[str, str],
        json: Any,
        *,
        parse: Callable[[bytes], Any] = jsonio.loads,
    ) -> tuple[Any, str | None]:
        url = self._origin.with_path(path)
        query = {**credentials.params, **params}
        headers = {**credentials.as_user(self._user()).headers, hdrs.ACCEPT_ENCODING: "identity"}
        body = None
        if json is not None:
            headers[hdrs.CONTENT_TYPE] = "application/json"
            body = jsonio.dumps(json)
        async with self._session.request(
            method,
            url.with_query(query) if query else url,
            headers=headers,
            data=body,
            allow_redirects=False,
            timeout=self._timeout,
        ) as response:
            answer = await response.read()
            if response.status != 200:
                raise UpstreamRefused(method, path, response.status, answer)
            return parse(answer) if answer else None, response.headers.get(hdrs.DATE)
