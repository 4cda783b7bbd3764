"""Per-request admission: the API key (or the kiosk page's session), the serving phase, and reading
the body within its size and time limits. Each check raises an APIError; none of them touches the engine.

The kiosk page with an API key (`serve --ui --api-key-file`): a page in a browser cannot be given the
key (anything that can read the page could read it too), so the server admits the page by a session
instead. Serving the page to a loopback peer sets SESSION_COOKIE, a random token made once per
process (HttpOnly: no script reads it; SameSite=Strict: no other site's page makes the browser send
it). A request carrying it is admitted like one with the key when its peer is loopback and it has no
Origin or the server's own: the browser on the device itself, the kiosk's. Everything else needs the
key. What that admits beyond a browser: any process on the device can fetch the page and so get a
session - with --ui, the device's own users can use the model, as they could use its screen; the
key keeps out the network and, through the guard, other sites' pages (docs/server.md "Security").
"""
from __future__ import annotations

import asyncio
import hmac
import ipaddress
import time
from typing import Any, Awaitable, Callable

from starlette.requests import ClientDisconnect, cookie_parser

from .apierror import APIError, echo

DRAIN_BODY_LIMIT = 16 << 20  # an oversized body up to this is read and dropped so the client sees the 413
SESSION_COOKIE = "edgespec_session"


def check_auth(state: Any, headers: Any, peer: str | None = None, *, session: bool = True) -> None:
    """Admits a request with the API key (or none configured), or (`session`) the kiosk page's session
    from `peer`, the client's address (see the module docstring)."""
    if not state.api_key:
        return
    scheme, _, token = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), state.api_key.encode()):
        return
    if not (session and kiosk_session(state, headers, peer)):
        raise APIError(401, "missing or wrong API key: send the header 'Authorization: Bearer <key>'",
                       code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


def session_cookie(state: Any, peer: str | None) -> str | None:
    """The Set-Cookie value that goes with the kiosk page served to `peer`, or None (no key, no
    session, or a peer that is not this device)."""
    if not state.session or not is_loopback(peer):
        return None
    return f"{SESSION_COOKIE}={state.session}; Path=/; HttpOnly; SameSite=Strict"


def kiosk_session(state: Any, headers: Any, peer: str | None) -> bool:
    if not state.session or not is_loopback(peer):
        return False
    origin = headers.get("origin")
    if origin is not None and origin.rstrip("/").lower() != f"http://{headers.get('host', '').lower()}":
        return False  # a --cors-origin site's page is not the kiosk page
    token = cookie_parser(headers.get("cookie", "")).get(SESSION_COOKIE, "")
    return hmac.compare_digest(token.encode(), state.session.encode())


def is_loopback(peer: str | None) -> bool:
    try:
        ip = ipaddress.ip_address(peer or "")
    except ValueError:
        return False
    return ip.is_loopback or bool(getattr(ip, "ipv4_mapped", None) and ip.ipv4_mapped.is_loopback)


def check_ready(state: Any) -> None:
    if state.phase == "ready":
        return
    if state.phase == "loading":
        raise APIError(503, "the model is still loading; retry in a few seconds", code="model_loading",
                       headers={"Retry-After": "5"})
    if state.phase == "draining":
        raise APIError(503, "the server is shutting down; retry against the restarted service",
                       code="shutting_down", headers={"Retry-After": "5"})
    raise APIError(503, f"the model failed to load: {state.failure}", code="model_failed")


async def read_body(receive: Callable[[], Awaitable[dict]], headers: Any, limit: int, timeout: float) -> bytes:
    """The whole body, which must arrive within `timeout` seconds of the headers (a client that sends
    half a body and waits is answered 408 and its connection closed, instead of holding a slot).
    Raises ClientDisconnect when the client hangs up before the end of the body."""
    too_big = APIError(413, f"request body is larger than this server accepts ({limit} bytes)", code="body_too_large")
    declared = headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise APIError(400, f"Content-Length is not a number: {echo(declared, 20)}") from None
        if size > DRAIN_BODY_LIMIT:
            raise too_big  # not worth reading: answer now and let the connection close
    deadline = time.monotonic() + timeout
    chunks: list[bytes] = []
    total = 0
    while True:
        try:
            message = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            raise APIError(408, f"the request body did not arrive within {timeout:g} s", code="body_timeout",
                           headers={"Connection": "close"}) from None
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        total += len(chunk)
        if total <= limit:
            chunks.append(chunk)
        elif total > DRAIN_BODY_LIMIT:
            break
        if not message.get("more_body", False):
            break
    if total > limit:
        raise too_big
    return b"".join(chunks)
