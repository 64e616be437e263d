"""The `mounted-links` addon: under `mount(app, prefix, …)`, the upstream's own URLs get the prefix.

opencode builds the URLs it sends (`Link` paging, redirects) from the address it was asked at,
which the relay's `X-Forwarded-*` headers name (`proxy.relay.headers`).
"""

from __future__ import annotations

import re
from typing import ClassVar
from urllib.parse import urlsplit

from aiohttp import hdrs
from multidict import CIMultiDict

from proxy.relay.hooks import Addon, Flow

_LINK_TARGET = re.compile(r"<([^>]*)>")
_URL_HEADERS = frozenset(name.lower() for name in (hdrs.LOCATION, hdrs.CONTENT_LOCATION))


class MountedLinks(Addon):
    """Under `mount(app, prefix, …)`, the URLs the upstream builds for the address it was asked
    at (`Link` paging, redirects) point at the proxy's origin without the prefix, so a client
    following them would leave the proxy. They get the prefix; every other URL is left alone."""

    name: ClassVar[str] = "mounted-links"

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix

    async def response_headers(self, flow: Flow) -> None:
        # opencode builds links from `Host` and `X-Forwarded-Proto` (anything but https is http).
        proto = "https" if flow.upstream_headers.get(hdrs.X_FORWARDED_PROTO, "") == "https" else "http"
        origin = f"{proto}://{flow.upstream_headers.get(hdrs.HOST, flow.request.host)}"
        prefix_own_urls(flow.response_headers, origin, self._prefix)


def prefix_own_urls(headers: CIMultiDict[str], origin: str, prefix: str) -> None:
    """Put `prefix` in front of the path of every URL in `Link`, `Location` and `Content-Location`
    that is path-absolute or on `origin`; everything else, order included, stays as it was."""
    rewritten = [(name, _with_prefix(name, value, origin, prefix)) for name, value in headers.items()]
    headers.clear()
    headers.extend(rewritten)


def _with_prefix(name: str, value: str, origin: str, prefix: str) -> str:
    if name.lower() == hdrs.LINK.lower():
        return _LINK_TARGET.sub(lambda found: f"<{_prefixed(found[1], origin, prefix)}>", value)
    if name.lower() in _URL_HEADERS:
        return _prefixed(value, origin, prefix)
    return value


def _prefixed(reference: str, origin: str, prefix: str) -> str:
    if reference.startswith("/") and not reference.startswith("//"):
        return prefix + reference
    try:
        parts = urlsplit(reference)
    except ValueError:
        return reference
    head = f"{parts.scheme}://{parts.netloc}"
    if parts.scheme and reference.startswith(head) and head.lower() == origin.lower():
        rest = reference[len(head) :]
        return head + prefix + (rest if rest.startswith("/") else "/" + rest)
    return reference
