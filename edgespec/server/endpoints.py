"""The small endpoints: /health, /ready, /v1/models, /metrics, the kiosk page and its files, and the
JSON answers for unknown paths and wrong methods."""
from __future__ import annotations

import mimetypes
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, Response

from .. import __version__
from ..errors import InvalidRequest
from .access import check_auth, session_cookie
from .apierror import APIError, clip, echo
from .metrics import memory_gauges
from .responses import error_response, json_response
from .state import ServerState

Handler = Callable[[Request], Awaitable[Response]]


class Endpoints:
    """The handlers, bound to the shared state."""

    def __init__(self, state: ServerState):
        self.state = state

    def counted(self, endpoint: str, fn: Handler) -> Handler:
        """Wraps a plain handler: API errors become OpenAI bodies, every answer is counted."""

        async def handler(request: Request) -> Response:
            t0 = time.monotonic()
            try:
                resp = await fn(request)
            except APIError as e:
                resp = error_response(e)
            self.state.metrics.observe_request(endpoint, resp.status_code, time.monotonic() - t0)
            return resp

        return handler

    async def health(self, request: Request) -> Response:
        return json_response({"status": "ok", "phase": self.state.phase, "version": __version__})

    async def ready(self, request: Request) -> Response:
        state = self.state
        if state.phase == "ready":
            ready: dict[str, Any] = {"status": "ready", "model": state.model_id}
            pinned = state.engine.pinned
            if "/" in state.static and pinned is not None and pinned.text:  # the kiosk page sends it back
                ready["system_prompt"] = pinned.text
            return json_response(ready)
        body: dict[str, Any] = {"status": state.phase}
        if state.failure:
            body["error"] = state.failure
        return json_response(body, 503, {"Retry-After": "5"} if state.phase == "loading" else None)

    async def models(self, request: Request) -> Response:
        check_auth(self.state, request.headers, _peer(request))
        cards = [self._model_card()]
        from .embeddings import served_embedder

        emb = served_embedder(self.state)
        if emb is not None:  # POST /v1/embeddings answers to it
            cards.append({"id": emb.manifest.name, "object": "model", "created": self.state.created, "owned_by": "edgespec"})
        return json_response({"object": "list", "data": cards})

    async def model(self, request: Request) -> Response:
        check_auth(self.state, request.headers, _peer(request))
        name = request.path_params["name"]
        if name not in self.state.names:
            raise APIError(404, f"model {echo(name)} is not served here; this server serves {self.state.model_id!r}",
                           param="model", code="model_not_found")
        return json_response(self._model_card())

    async def metrics(self, request: Request) -> Response:
        state = self.state
        check_auth(state, request.headers, _peer(request))
        sched = state.scheduler
        gauges = {
            "edgespec_ready": ("1 when the model is loaded and requests are served", int(state.phase == "ready")),
            "edgespec_queue_depth": ("requests waiting for the engine", sched.depth),
            "edgespec_queue_capacity": ("requests that may wait before 429", sched.max_queue),
            "edgespec_busy": ("1 while a request is generating", int(sched.running is not None)),
            # every endpoint that queues: embeddings (slices.py) and the coalesced docs reload (reload.py)
            "edgespec_embeddings_queue_depth": ("embeddings requests waiting", sched.embeddings.depth),
            "edgespec_embeddings_queue_capacity": ("embeddings requests that may wait before 429",
                                                   sched.embeddings.max_queue),
            "edgespec_embeddings_busy": ("1 while an embeddings request runs", int(sched.embeddings.current is not None)),
            "edgespec_docs_reload_waiting": ("docs reload calls waiting for the pending or running reload",
                                             state.reloads.waiting),
            "edgespec_docs_reload_running": ("1 while the document index is being read again", int(state.reloads.reading)),
        }
        gauges.update(sched.gauges())  # slots, active requests, batch size of the last round
        gauges.update(memory_gauges(state.engine))  # resident memory, suffix indexes, caches: scripts/soak.sh
        text = state.metrics.render(gauges, {"version": __version__, "model": state.model_id},
                                    governor=state.engine.governor if state.engine is not None else None)
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    async def docs_reload(self, request: Request) -> Response:
        """POST /v1/docs/reload: read the document index again (after `edgespec index` rebuilt it), as
        SIGHUP does; a bad index is refused and the one in use stays (docs/answer.py). Coalesced
        (reload.py): concurrent calls share one reload, at most one per --reload-interval. An admin's
        action: with an API key set, the kiosk page's session does not admit it."""
        check_auth(self.state, request.headers, _peer(request), session=False)
        if self.state.docs is None:
            raise APIError(404, "this server has no documents: serve it with --docs INDEX", code="no_documents")
        try:
            body, joined = await self.state.reloads.reload(self.state.engine)
        except LookupError as e:
            raise APIError(404, str(e), code="no_documents") from None
        except InvalidRequest as e:
            raise APIError(409, f"the index was not reloaded, the one in use stays: {e}", code="index_unusable") from None
        return json_response({**body, "joined": joined})

    async def index(self, request: Request) -> Response:
        state = self.state
        if "/" in state.static:
            page = _static(state.static["/"])
            cookie = session_cookie(state, _peer(request))
            if cookie:
                page.headers.append("set-cookie", cookie)
            return page
        return json_response({
            "service": "edgespec", "version": __version__, "model": state.model_id, "phase": state.phase,
            "endpoints": ["POST /v1/chat/completions", "POST /v1/completions", "POST /v1/embeddings", "GET /v1/models", "GET /health",
                          "GET /ready", "GET /metrics"],
        })

    async def static(self, request: Request) -> Response:
        path = self.state.static.get(request.url.path)
        if path is None:
            raise HTTPException(404)
        return _static(path)

    async def on_http_error(self, request: Request, exc: Exception) -> Response:
        code = getattr(exc, "status_code", 500)
        if code == 405:
            return error_response(APIError(405, f"method {request.method} is not allowed on {clip(request.url.path)}"))
        if code == 404:
            return error_response(APIError(404, f"no such endpoint: {request.method} {clip(request.url.path)}",
                                           code="not_found"))
        return error_response(APIError(code, str(getattr(exc, "detail", "error"))))

    def _model_card(self) -> dict[str, Any]:
        s = self.state
        return {"id": s.model_id, "object": "model", "created": s.created, "owned_by": "edgespec"}


def _peer(request: Request) -> str | None:
    return request.client.host if request.client else None


def _static(path: Path) -> Response:
    media = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    return FileResponse(path, media_type=media, headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"})
