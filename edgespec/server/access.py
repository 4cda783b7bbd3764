"""Per-request admission: the API key, the serving phase, and reading the body within its size and
time limits. Each check raises an APIError; none of them touches the engine."""
from __future__ import annotations

import asyncio
import hmac
import time
from typing import Any, Awaitable, Callable

from starlette.requests import ClientDisconnect

from .apierror import APIError, echo

DRAIN_BODY_LIMIT = 16 << 20  # an oversized body up to this is read and dropped so the client sees the 413


def check_auth(state: Any, headers: Any) -> None:
    if not state.api_key:
        return
    scheme, _, token = headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), state.api_key.encode()):
        raise APIError(401, "missing or wrong API key: send the header 'Authorization: Bearer <key>'",
                       code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


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
