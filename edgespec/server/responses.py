"""Building answers: JSON bodies, OpenAI-style error bodies, and the mapping from what the engine
or the queue ended with to a status code (the caller's fault is 4xx, ours is 5xx)."""
from __future__ import annotations

from typing import Any

from starlette.responses import Response

from ..errors import EdgespecError, InvalidRequest, PromptTooLong
from . import shapes
from .apierror import APIError
from .scheduler import SHUTDOWN, Job
from .validate import too_long


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(shapes.dumps(body), status_code=status, headers=headers, media_type="application/json")


def error_response(e: APIError, request_id: str | None = None) -> Response:
    headers = dict(e.headers)
    if request_id:
        headers["X-Request-Id"] = request_id
    return json_response(e.body(), e.status, headers)


def as_api_error(e: BaseException, request_id: str) -> APIError:
    """Maps what the engine raised to a status: the caller's fault is 400, ours is 500."""
    if isinstance(e, APIError):
        return e
    if isinstance(e, PromptTooLong):
        return too_long(e.prompt_tokens, e.capacity, e.param or "messages")
    if isinstance(e, InvalidRequest):
        return APIError(400, str(e), param=e.param)
    if isinstance(e, EdgespecError):
        return APIError(500, f"generation failed: {e}", code="engine_error")
    return APIError(500, f"internal error during generation ({type(e).__name__}); see the server log for request {request_id}",
                    code="internal_error")


def cancelled_error(job: Job, tokens: int) -> APIError:
    if job.cancel_reason == SHUTDOWN:
        return APIError(503, f"the server shut down during this request (after {tokens} tokens); retry",
                        code="shutting_down", headers={"Retry-After": "5"})
    timeout = job.timeout
    if job.started is None:
        return APIError(504, f"the request waited {timeout:g} s in the queue without reaching the engine "
                             "(the server's request timeout); retry later", code="timeout")
    return APIError(504, f"generation exceeded the server's request timeout of {timeout:g} s "
                         f"after {tokens} tokens; ask for fewer tokens", code="timeout")
