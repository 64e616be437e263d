"""Header hygiene for a reverse proxy (RFC 9110 §7.6.1), in the manner of Go's httputil.

Hop-by-hop headers describe one connection and must not be forwarded; the `X-Forwarded-*`
headers tell the upstream who the client is and which host and scheme it used, which
opencode needs to build pagination links that point at the proxy rather than at itself
(under a mount prefix, `proxy.addons.mounted_links` puts the prefix in them).
"""

from __future__ import annotations

from collections.abc import Iterable

from aiohttp import hdrs, web
from multidict import CIMultiDict, CIMultiDictProxy

HOP_BY_HOP = frozenset(
    header.lower()
    for header in (
        hdrs.CONNECTION,
        hdrs.KEEP_ALIVE,
        hdrs.PROXY_AUTHENTICATE,
        hdrs.PROXY_AUTHORIZATION,
        hdrs.TE,
        hdrs.TRAILER,
        hdrs.TRANSFER_ENCODING,
        hdrs.UPGRADE,
        "Proxy-Connection",
    )
)


def end_to_end(
    headers: CIMultiDictProxy[str] | CIMultiDict[str], drop: Iterable[str] = ()
) -> CIMultiDict[str]:
    """Return `headers` without hop-by-hop ones, those named in `Connection`, and `drop`.

    A copy with the excluded names popped keeps the order of the rest and costs a quarter of
    filtering the headers one by one (it runs twice on every request)."""
    kept = CIMultiDict(headers)
    for name in HOP_BY_HOP:
        kept.popall(name, None)
    for name in drop:
        kept.popall(name, None)
    for value in headers.getall(hdrs.CONNECTION, ()):
        for token in value.split(","):
            kept.popall(token.strip(), None)
    return kept


def upstream_request_headers(request: web.Request) -> CIMultiDict[str]:
    """Headers to send upstream for `request`: end-to-end ones plus `X-Forwarded-*`.

    `Host` is kept as the client sent it (as nginx's `proxy_set_header Host $host`) so the
    links opencode builds from it lead back through the proxy.
    """
    headers = end_to_end(request.headers, drop=(hdrs.CONTENT_LENGTH,) if not request.body_exists else ())
    peer = request.remote or ""
    prior = request.headers.get(hdrs.X_FORWARDED_FOR)
    headers[hdrs.X_FORWARDED_FOR] = f"{prior}, {peer}" if prior else peer
    headers.setdefault(hdrs.X_FORWARDED_PROTO, request.scheme)
    headers.setdefault(hdrs.X_FORWARDED_HOST, request.host)
    return headers


def client_response_headers(headers: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    """Headers to send the client: end-to-end ones; framing is decided by the proxy."""
    return end_to_end(headers, drop=(hdrs.CONTENT_LENGTH,))


UPSTREAM_HEADERS = web.ResponseKey("upstream_headers", CIMultiDictProxy[str])
"""On a response built from an upstream answer: the headers that answer came with."""
_NEVER_INVENTED = (hdrs.SERVER, hdrs.CONTENT_TYPE)


async def drop_invented_headers(_: web.Request, response: web.StreamResponse) -> None:
    """`on_response_prepare`: aiohttp gives every response a `Server` (its own name and version)
    and a default `Content-Type`. On a forwarded answer that lacked them they would be claims
    the upstream never made, so they go; on the proxy's own answers (its errors, `/_settle/*`)
    `Server` would tell anyone who can reach the port which versions of the stack to attack.
    (`Date` stays: RFC 9110 §6.6.1 asks a forwarder to add it.)"""
    sent = response.get(UPSTREAM_HEADERS)
    if sent is None:
        response.headers.popall(hdrs.SERVER, None)
        return
    for name in _NEVER_INVENTED:
        if name not in sent:
            response.headers.popall(name, None)


def unsupported_transfer_coding(request: web.Request) -> str | None:
    """The request's transfer codings when they are anything but plain `chunked`, else None.

    aiohttp removes the chunked framing of a request body but no other coding, and the header
    is hop-by-hop, so a body sent `gzip, chunked` would reach the upstream still gzipped with
    nothing saying so. Such a request must be refused (RFC 9112 §6.1), as nginx and Go do.
    """
    codings = [
        coding.strip().lower()
        for value in request.headers.getall(hdrs.TRANSFER_ENCODING, ())
        for coding in value.split(",")
    ]
    return None if codings in ([], ["chunked"]) else ", ".join(codings)
