"""The HTTP surface: OpenAI-compatible generation endpoints, health/readiness, Prometheus metrics and
the optional kiosk page. Starlette routes the requests; the two generation endpoints are plain ASGI
callables because they must watch the connection (a client that hangs up cancels its generation)
and decide the status code only when the first token or error is known.

Request flow: auth -> ready? -> body (size-limited) -> validate -> count prompt tokens -> queue ->
worker thread -> events back here -> JSON or server-sent events. Every failure before the engine
answers is an OpenAI-style error with a 4xx/5xx status; nothing a request carries is used as a path.
"""
from __future__ import annotations

import asyncio
import hmac
import logging
import mimetypes
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route

from .. import __version__
from ..errors import EdgespecError, InvalidRequest, PromptTooLong
from . import shapes
from .apierror import APIError
from .config import ServerConfig
from .metrics import Metrics
from .scheduler import CLIENT_GONE, SHUTDOWN, TIMEOUT, Job, Scheduler
from .validate import Limits, parse_chat, parse_completion, parse_json, too_long

log = logging.getLogger("edgespec.server")
reqlog = logging.getLogger("edgespec.server.requests")

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
DRAIN_BODY_LIMIT = 16 << 20  # an oversized body up to this is read and dropped so the client sees the 413
ANSWER_GRACE = 30.0  # after the deadline, how long a running pass may take before we answer 504 anyway
CLIENT_CLOSED = 499  # logged (never sent) when the client went away first, as nginx does


class ServerState:
    """Everything the handlers share. `phase`: loading -> ready -> draining, or failed."""

    def __init__(self, config: ServerConfig, scheduler: Scheduler, *, default_name: str = "edgespec",
                 api_key: str | None = None):
        self.config = config
        self.scheduler = scheduler
        self.metrics = Metrics()
        self.api_key = api_key
        self.engine: Any = None
        self.phase = "loading"
        self.failure: str | None = None
        self.model_id = config.model_names[0] if config.model_names else default_name
        self.names = tuple(dict.fromkeys([self.model_id, *config.model_names, default_name]))
        self.limits = Limits(self.names, config.max_tokens_limit, config.default_max_tokens, config.default_temperature)
        self.created = int(time.time())
        self.static = static_files(STATIC_DIR) if config.ui else {}

    def set_engine(self, engine: Any) -> None:
        """Called once the engine is loaded and warm; from then on /ready is 200."""
        self.engine = engine
        name = getattr(engine, "model_name", None)
        if name:
            self.names = tuple(dict.fromkeys([*self.names, name]))
        # max_tokens is not capped by the cache: a request that outgrows it ends with finish_reason
        # "length" (the engine's "cache_full"), as a long chat on a small-memory board should
        self.limits = Limits(self.names, self.config.max_tokens_limit, self.config.default_max_tokens,
                             self.config.default_temperature)


def static_files(root: Path) -> dict[str, Path]:
    """URL path -> file, listed once at start-up from the package's own folder. Requests are looked up
    in this table and never joined onto a filesystem path, so no URL can reach another file."""
    files: dict[str, Path] = {}
    if not root.is_dir():
        return files
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if any(part.startswith(".") for part in rel.parts) or p.is_symlink() or not p.is_file():
            continue
        files["/" + rel.as_posix()] = p
        files["/static/" + rel.as_posix()] = p
    if "/index.html" in files:
        files["/"] = files["/index.html"]
    return files


# --- small helpers -------------------------------------------------------------------------------
def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(shapes.dumps(body), status_code=status, headers=headers, media_type="application/json")


def error_response(e: APIError, request_id: str | None = None) -> Response:
    headers = dict(e.headers)
    if request_id:
        headers["X-Request-Id"] = request_id
    return json_response(e.body(), e.status, headers)


def check_auth(state: ServerState, request: Request) -> None:
    if not state.api_key:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), state.api_key.encode()):
        raise APIError(401, "missing or wrong API key: send the header 'Authorization: Bearer <key>'",
                       code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


def check_ready(state: ServerState) -> None:
    if state.phase == "ready":
        return
    if state.phase == "loading":
        raise APIError(503, "the model is still loading; retry in a few seconds", code="model_loading",
                       headers={"Retry-After": "5"})
    if state.phase == "draining":
        raise APIError(503, "the server is shutting down; retry against the restarted service",
                       code="shutting_down", headers={"Retry-After": "5"})
    raise APIError(503, f"the model failed to load: {state.failure}", code="model_failed")


async def read_body(request: Request, limit: int) -> bytes:
    too_big = APIError(413, f"request body is larger than this server accepts ({limit} bytes)", code="body_too_large")
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise APIError(400, f"Content-Length is not a number: {declared[:20]!r}") from None
        if size > DRAIN_BODY_LIMIT:
            raise too_big  # not worth reading: answer now and let the connection close
    chunks: list[bytes] = []
    total = 0
    async for chunk in request.stream():
        total += len(chunk)
        if total <= limit:
            chunks.append(chunk)
        elif total > DRAIN_BODY_LIMIT:
            break
    if total > limit:
        raise too_big
    return b"".join(chunks)


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


@dataclass
class Outcome:
    """What one generation request ended as: for the log line and the metrics."""

    status: int = 500
    result: Any = None
    error: str | None = None
    tokens_sent: int = 0


# --- generation endpoints ------------------------------------------------------------------------
class GenerationEndpoint:
    """POST /v1/chat/completions and POST /v1/completions, as one ASGI callable each."""

    def __init__(self, state: ServerState, kind: str):
        self.state = state
        self.kind = kind
        self.endpoint = "chat" if kind == "chat" else "completions"

    async def __call__(self, scope, receive, send) -> None:
        request = Request(scope, receive)
        t0 = time.monotonic()
        rid = ("chatcmpl-" if self.kind == "chat" else "cmpl-") + secrets.token_hex(12)
        out = Outcome()
        job: Job | None = None
        stream = False
        try:
            if request.method != "POST":
                raise APIError(405, f"use POST for {request.url.path}", headers={"Allow": "POST"})
            check_auth(self.state, request)
            check_ready(self.state)
            raw = await read_body(request, self.state.config.max_body_bytes)
            body = parse_json(raw)
            parse = parse_chat if self.kind == "chat" else parse_completion
            req = parse(body, self.state.limits)
            stream = req.stream
            engine = self.state.engine
            try:
                n = await run_in_threadpool(engine.count_tokens, **req.prompt_kwargs())
            except PromptTooLong as e:
                raise too_long(e.prompt_tokens, e.capacity, "messages" if self.kind == "chat" else "prompt") from None
            except InvalidRequest as e:
                raise APIError(400, str(e), param=e.param) from None
            if n + 1 > engine.max_len:
                raise too_long(n, engine.max_len, "messages" if self.kind == "chat" else "prompt")
            timeout = self.state.config.request_timeout
            job = Job(rid, req, asyncio.get_running_loop(), deadline=t0 + timeout, timeout=timeout,
                      prompt_tokens=n, created=t0)
            self.state.scheduler.submit(job)
        except Exception as e:  # noqa: BLE001 - whatever goes wrong before the queue is this request's alone
            if not isinstance(e, APIError):
                log.exception("request %s failed before reaching the engine", rid)
                e = APIError(500, f"internal error ({type(e).__name__}); see the server log for request {rid}",
                             code="internal_error")
            out.status, out.error = e.status, e.message
            await error_response(e, rid)(scope, receive, send)
            self._finish(rid, t0, stream, job, out)
            return

        watcher = asyncio.create_task(self._watch_disconnect(receive, job))
        try:
            if stream:
                await self._stream(job, send, rid, out)
            else:
                await self._single(job, scope, receive, send, rid, out)
        finally:
            watcher.cancel()
            if job.finished is None and not job.cancelled:
                job.cancel(CLIENT_GONE)  # the handler is leaving early: free the engine at the next pass
            self.state.scheduler.withdraw(job)
            self._finish(rid, t0, stream, job, out)

    async def _watch_disconnect(self, receive, job: Job) -> None:
        """The body has been read, so the next ASGI message is the disconnect (or the end of the response)."""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                if job.finished is None:
                    job.cancel(CLIENT_GONE)
                    job.events.put_nowait(("disconnect", None))
                return

    async def _next(self, job: Job) -> tuple[str, Any]:
        """The next worker event, or ("timeout", None) once the request's time is up."""
        while True:
            limit = job.deadline if job.started is None else job.deadline + ANSWER_GRACE
            remaining = limit - time.monotonic()
            if remaining <= 0:
                if job.started is None or job.finished is None:
                    job.cancel(TIMEOUT)
                    self.state.scheduler.withdraw(job)
                    return ("timeout", None)
            try:
                return await asyncio.wait_for(job.events.get(), timeout=max(0.01, min(remaining, 1.0)))
            except asyncio.TimeoutError:
                continue

    def _failure(self, job: Job, kind: str, value: Any, tokens: int) -> APIError | None:
        """The error this event means, or None if it is not one (a delta or a completed result)."""
        if kind == "error":
            return as_api_error(value, job.id)
        if kind == "timeout":
            job.cancel_reason = job.cancel_reason or TIMEOUT
            return cancelled_error(job, tokens)
        if kind == "done" and value.finish_reason == "cancelled":
            return cancelled_error(job, tokens)
        return None

    async def _single(self, job: Job, scope, receive, send, rid: str, out: Outcome) -> None:
        tokens = 0
        while True:
            kind, value = await self._next(job)
            if kind == "start":
                continue
            if kind == "delta":
                tokens += 1
                continue
            if kind == "disconnect":
                out.status, out.error = CLIENT_CLOSED, "client disconnected"
                return
            if kind == "done":
                out.result = value
            err = self._failure(job, kind, value, getattr(getattr(value, "stats", None), "new_tokens", tokens))
            if err is not None:
                if job.cancel_reason == CLIENT_GONE:
                    out.status, out.error = CLIENT_CLOSED, "client disconnected"
                    return
                out.status, out.error = err.status, err.message
                await error_response(err, rid)(scope, receive, send)
                return
            model = job.request.model or self.state.model_id
            body = shapes.completion_body(self.kind, rid, model, value.text, value, _queue_s(job))
            out.status = 200
            await json_response(body, 200, {"X-Request-Id": rid})(scope, receive, send)
            return

    async def _stream(self, job: Job, send, rid: str, out: Outcome) -> None:
        # hold the status line until the first token or error is known, so errors keep their status code
        kind, value = "start", None
        while kind == "start":
            kind, value = await self._next(job)
        if kind == "disconnect":
            out.status, out.error = CLIENT_CLOSED, "client disconnected"
            return
        if kind == "done":
            out.result = value
        err = self._failure(job, kind, value, 0)
        if err is not None:
            if job.cancel_reason == CLIENT_GONE:
                out.status, out.error = CLIENT_CLOSED, "client disconnected"
                return
            out.status, out.error = err.status, err.message
            resp = error_response(err, rid)
            await send({"type": "http.response.start", "status": resp.status_code, "headers": resp.raw_headers})
            await send({"type": "http.response.body", "body": resp.body})
            return

        writer = shapes.ChunkWriter(self.kind, rid, job.request.model or self.state.model_id)
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),
            (b"x-request-id", rid.encode()),
        ]})
        out.status = 200
        first = writer.first()
        if first:
            await send({"type": "http.response.body", "body": first, "more_body": True})
        while True:
            if kind == "disconnect":
                out.status, out.error = CLIENT_CLOSED, "client disconnected"
                return
            if kind == "delta":
                out.tokens_sent += 1
                await send({"type": "http.response.body", "body": writer.delta(value), "more_body": True})
            elif kind in ("done", "error", "timeout"):
                if kind == "done":
                    out.result = value
                n = getattr(getattr(value, "stats", None), "new_tokens", out.tokens_sent)
                err = self._failure(job, kind, value, n)
                if err is not None and job.cancel_reason == CLIENT_GONE:
                    out.status, out.error = CLIENT_CLOSED, "client disconnected"
                    return
                if err is not None:  # too late for a status code: an error event, as OpenAI does
                    out.status, out.error = err.status, err.message
                    tail = writer.error(err.body())
                else:
                    tail = writer.final(value, _queue_s(job), job.request.include_usage)
                await send({"type": "http.response.body", "body": tail + shapes.DONE, "more_body": False})
                return
            kind, value = await self._next(job)

    def _finish(self, rid: str, t0: float, stream: bool, job: Job | None, out: Outcome) -> None:
        total = time.monotonic() - t0
        self.state.metrics.observe_request(self.endpoint, out.status, total)
        stats = getattr(out.result, "stats", None)
        ttft = queue_s = gen_s = None
        if job is not None:
            queue_s = _queue_s(job)
            if job.first_delta is not None:
                ttft = job.first_delta - job.created
            if job.started is not None and job.finished is not None:
                gen_s = job.finished - job.started
        if stats is not None:
            self.state.metrics.observe_generation(stats, ttft=ttft, queue_wait=queue_s, seconds=gen_s)
        fields: list[tuple[str, Any]] = [("req", rid), ("endpoint", self.endpoint), ("status", out.status),
                                         ("stream", int(stream))]
        if job is not None:
            fields.append(("prompt_tokens", job.prompt_tokens))
        if stats is not None:
            g = lambda name: getattr(stats, name, None)  # noqa: E731
            fields += [("completion_tokens", g("new_tokens")), ("tok_s", g("decode_tokens_per_second")),
                       ("drafted", g("drafted")), ("accepted", g("accepted")), ("accept", g("acceptance_rate")),
                       ("drafter", g("drafter")), ("batch", g("batch_size_mean")),
                       ("finish", out.result.finish_reason)]
        fields += [("ttft_s", ttft), ("queue_s", queue_s), ("total_s", total)]
        if out.error:
            fields.append(("error", out.error))
        reqlog.info(" ".join(f"{k}={_fmt(v)}" for k, v in fields if v is not None))


def _queue_s(job: Job) -> float | None:
    return None if job.started is None or job.queued is None else job.started - job.queued


def _fmt(v: Any) -> str:
    """logfmt: numbers compact, strings quoted only when they need it (journald shows the line as is)."""
    if isinstance(v, float):
        return f"{v:.0f}" if abs(v) >= 100 else f"{v:.2f}" if abs(v) >= 1 else f"{v:.3f}"
    s = str(v)
    if not s or any(c in s for c in ' "=') or any(ord(c) < 32 for c in s):
        return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    return s


# --- the other endpoints ---------------------------------------------------------------------------
def create_app(state: ServerState) -> Starlette:
    def counted(endpoint: str):
        """Wraps a plain handler: auth/API errors become OpenAI bodies, every answer is counted."""

        def wrap(fn):
            async def handler(request: Request) -> Response:
                t0 = time.monotonic()
                try:
                    resp = await fn(request)
                except APIError as e:
                    resp = error_response(e)
                state.metrics.observe_request(endpoint, resp.status_code, time.monotonic() - t0)
                return resp

            return handler

        return wrap

    @counted("health")
    async def health(request: Request) -> Response:
        return json_response({"status": "ok", "phase": state.phase, "version": __version__})

    @counted("ready")
    async def ready(request: Request) -> Response:
        if state.phase == "ready":
            return json_response({"status": "ready", "model": state.model_id})
        body: dict[str, Any] = {"status": state.phase}
        if state.failure:
            body["error"] = state.failure
        return json_response(body, 503, {"Retry-After": "5"} if state.phase == "loading" else None)

    @counted("models")
    async def models(request: Request) -> Response:
        check_auth(state, request)
        return json_response({"object": "list", "data": [_model_card(state)]})

    @counted("models")
    async def model(request: Request) -> Response:
        check_auth(state, request)
        name = request.path_params["name"]
        if name not in state.names:
            raise APIError(404, f"model {name!r} is not served here; this server serves {state.model_id!r}",
                           param="model", code="model_not_found")
        return json_response(_model_card(state))

    @counted("metrics")
    async def metrics(request: Request) -> Response:
        check_auth(state, request)
        sched = state.scheduler
        gauges = {
            "edgespec_ready": ("1 when the model is loaded and requests are served", int(state.phase == "ready")),
            "edgespec_queue_depth": ("requests waiting for the engine", sched.depth),
            "edgespec_queue_capacity": ("requests that may wait before 429", sched.max_queue),
            "edgespec_busy": ("1 while a request is generating", int(sched.running is not None)),
        }
        if hasattr(sched, "gauges"):  # --parallel N: slots, active requests, batch size of the last round
            gauges.update(sched.gauges())
        text = state.metrics.render(gauges, {"version": __version__, "model": state.model_id},
                                    governor=getattr(state.engine, "governor", None))
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    async def index(request: Request) -> Response:
        if "/" in state.static:
            return _static(state.static["/"])
        return json_response({
            "service": "edgespec", "version": __version__, "model": state.model_id, "phase": state.phase,
            "endpoints": ["POST /v1/chat/completions", "POST /v1/completions", "GET /v1/models", "GET /health",
                          "GET /ready", "GET /metrics"],
        })

    async def static(request: Request) -> Response:
        path = state.static.get(request.url.path)
        if path is None:
            raise HTTPException(404)
        return _static(path)

    async def on_http_error(request: Request, exc: Exception) -> Response:
        code = getattr(exc, "status_code", 500)
        if code == 405:
            return error_response(APIError(405, f"method {request.method} is not allowed on {request.url.path}"))
        return error_response(APIError(code, f"no such endpoint: {request.method} {request.url.path}"
                                       if code == 404 else str(getattr(exc, "detail", "error")), code="not_found" if code == 404 else None))

    routes = [
        Route("/v1/chat/completions", GenerationEndpoint(state, "chat"), methods=["POST"]),
        Route("/v1/completions", GenerationEndpoint(state, "completion"), methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{name:path}", model, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/ready", ready, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/", index, methods=["GET"]),
    ]
    if state.static:
        routes.append(Route("/{path:path}", static, methods=["GET"]))
    return Starlette(routes=routes, exception_handlers={HTTPException: on_http_error})


def _model_card(state: ServerState) -> dict[str, Any]:
    return {"id": state.model_id, "object": "model", "created": state.created, "owned_by": "edgespec"}


def _static(path: Path) -> Response:
    media = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    return FileResponse(path, media_type=media, headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"})
