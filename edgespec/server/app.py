"""The HTTP surface: OpenAI-compatible generation endpoints (generation.py), health/readiness,
Prometheus metrics and the optional kiosk page (endpoints.py), all behind the request guard
(guard.py: Host, Origin, Content-Type). This module only wires them together.

Every failure is an OpenAI-style error with a 4xx/5xx status; nothing a request carries is used as a path.
"""
from __future__ import annotations

from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.routing import Route

from .embeddings import EmbeddingsEndpoint
from .endpoints import Endpoints
from .generation import GenerationEndpoint
from .guard import Guard
from .state import ServerState


def create_app(state: ServerState) -> Any:
    e = Endpoints(state)
    routes = [
        Route("/v1/chat/completions", GenerationEndpoint(state, "chat"), methods=["POST"]),
        Route("/v1/completions", GenerationEndpoint(state, "completion"), methods=["POST"]),
        Route("/v1/embeddings", e.counted("embeddings", EmbeddingsEndpoint(state)), methods=["POST"]),
        Route("/v1/models", e.counted("models", e.models), methods=["GET"]),
        Route("/v1/models/{name:path}", e.counted("models", e.model), methods=["GET"]),
        Route("/v1/docs/reload", e.counted("docs_reload", e.docs_reload), methods=["POST"]),
        Route("/health", e.counted("health", e.health), methods=["GET"]),
        Route("/ready", e.counted("ready", e.ready), methods=["GET"]),
        Route("/metrics", e.counted("metrics", e.metrics), methods=["GET"]),
        Route("/", e.index, methods=["GET"]),
    ]
    if state.static:
        routes.append(Route("/{path:path}", e.static, methods=["GET"]))
    app = Starlette(routes=routes, exception_handlers={HTTPException: e.on_http_error})
    return Guard(app, state)
