"""HTTP errors in OpenAI's shape, so every OpenAI client raises its usual exception with our message.

Body: {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}. The `openai` package maps the
status code to its exception class (400 BadRequestError, 401 AuthenticationError, 404 NotFoundError,
413/429/5xx ...) and shows `message`, so the message is the whole user-facing explanation.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ECHO_LIMIT = 200  # characters of a client's value an error message or a log line may repeat

# status -> OpenAI error type
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    403: "permission_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable",
    504: "timeout_error",
}


@dataclass
class APIError(Exception):
    status: int
    message: str
    param: str | None = None
    code: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__init__(self.message)

    @property
    def type(self) -> str:
        return _TYPES.get(self.status, "server_error" if self.status >= 500 else "invalid_request_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def clip(text: str, limit: int = ECHO_LIMIT) -> str:
    """`text` cut to `limit` characters, with an ellipsis and the full length when it was longer."""
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


def echo(value: Any, limit: int = ECHO_LIMIT) -> str:
    """A client's value as an error body or a log line may show it: repr(), at most `limit` characters
    of it. The one way a request's value is repeated back: a request may carry a 900 KB model name,
    and an answer or a log line holding it whole costs 900 KB each time."""
    if isinstance(value, str):
        return repr(value) if len(value) <= limit else f"{value[:limit]!r}… ({len(value)} characters)"
    try:
        return clip(repr(value), limit)
    except ValueError:  # repr() of an integer of over 4300 digits raises (Python >= 3.11)
        return f"<{type(value).__name__}>"


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)
