"""POST /v1/chat/completions and POST /v1/completions: one plain ASGI callable each, because they must
watch the connection (a client that hangs up cancels its generation) and decide the status code only
when the first token or error is known.

Request flow: auth -> ready? -> body (size- and time-limited) -> validate -> the engine prepares it
(documents read, options checked, prompt tokenized: once) -> queue -> worker thread -> events back
here -> JSON or server-sent events. A client that goes away, whenever it happens, surfaces as one
exception (ClientGone) handled in one place: logged as 499, nothing sent.
"""
from __future__ import annotations

import asyncio
import logging
import secrets
import time
from dataclasses import dataclass
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect

from ..errors import InvalidRequest, PromptTooLong
from . import shapes
from .access import check_auth, check_ready, read_body
from .apierror import APIError
from .responses import as_api_error, cancelled_error, error_response, json_response
from .scheduler import CLIENT_GONE, TIMEOUT, Job
from .state import ServerState
from .validate import parse_request, too_long

log = logging.getLogger("edgespec.server")
reqlog = logging.getLogger("edgespec.server.requests")

ANSWER_GRACE = 30.0  # after the deadline, how long a running pass may take before we answer 504 anyway
CLIENT_CLOSED = 499  # logged (never sent) when the client went away first, as nginx does


class ClientGone(Exception):
    """The client hung up (while sending its body, waiting in the queue or receiving the answer)."""


@dataclass
class Outcome:
    """What one generation request ended as: for the log line and the metrics."""

    status: int = 500
    result: Any = None
    error: str | None = None
    tokens_sent: int = 0


class GenerationEndpoint:
    def __init__(self, state: ServerState, kind: str):
        self.state = state
        self.kind = kind
        self.endpoint = "chat" if kind == "chat" else "completions"
        self.param = "messages" if kind == "chat" else "prompt"

    async def __call__(self, scope, receive, send) -> None:
        t0 = time.monotonic()
        rid = ("chatcmpl-" if self.kind == "chat" else "cmpl-") + secrets.token_hex(12)
        out = Outcome()
        job: Job | None = None
        stream = False
        watcher: asyncio.Task | None = None
        try:
            try:
                job = await self._admit(scope, receive, rid, t0)
            except ClientDisconnect:
                raise ClientGone() from None
            except APIError:
                raise
            except Exception as e:  # noqa: BLE001 - whatever goes wrong before the queue is this request's alone
                log.exception("request %s failed before reaching the engine", rid)
                raise APIError(500, f"internal error ({type(e).__name__}); see the server log for request {rid}",
                               code="internal_error") from None
            stream = job.request.stream
            gone = asyncio.Event()
            watcher = asyncio.create_task(self._watch_disconnect(receive, job, gone))
            if stream:
                await self._stream(job, _Sender(send, gone), rid, out)
            else:
                await self._single(job, _Sender(send, gone), rid, out)
        except ClientGone:
            out.status, out.error = CLIENT_CLOSED, "client disconnected"
        except APIError as e:
            out.status, out.error = e.status, e.message
            await _send_response(send, error_response(e, rid))
        finally:
            if watcher is not None:
                watcher.cancel()
            if job is not None:
                if job.finished is None and not job.cancelled:
                    job.cancel(CLIENT_GONE)  # the handler is leaving early: free the engine at the next pass
                self.state.scheduler.withdraw(job)
            self._finish(rid, t0, stream, job, out)

    async def _admit(self, scope, receive, rid: str, t0: float) -> Job:
        """Checks, reads and validates the request and puts it in the queue."""
        headers = Headers(scope=scope)
        if scope["method"] != "POST":
            raise APIError(405, f"use POST for {scope['path']}", headers={"Allow": "POST"})
        check_auth(self.state, headers, (scope.get("client") or (None,))[0])
        check_ready(self.state)
        cfg = self.state.config
        raw = await read_body(receive, headers, cfg.max_body_bytes, cfg.body_timeout)
        # off the event loop: a 1 MiB body of 30,000 messages takes a tenth of a second to check, which
        # every other connection would otherwise wait out
        req = await run_in_threadpool(parse_request, self.kind, raw, self.state.limits)
        timeout = cfg.request_timeout
        job = Job(rid, req, asyncio.get_running_loop(), deadline=t0 + timeout, timeout=timeout, created=t0)
        # the engine prepares the request once, here (its values checked, documents, the prompt's
        # tokens): a bad one is a 400 before it is queued, naming the client's field, and the worker
        # runs what was prepared
        try:
            job.prepared = await run_in_threadpool(self.state.engine.prepare, **req.engine_kwargs(),
                                                   cancel=job.should_stop)
        except PromptTooLong as e:
            raise too_long(e.prompt_tokens, e.capacity, self.param) from None
        except InvalidRequest as e:
            raise req.client_error(e) from None
        job.prompt_tokens = job.prepared.prompt_tokens
        self.state.scheduler.submit(job)
        return job

    async def _watch_disconnect(self, receive, job: Job, gone: asyncio.Event) -> None:
        """The body has been read, so the next ASGI message is the disconnect (or the end of the response).
        `gone` is set whenever it comes, the generation finished or not: the answer still being sent
        is then not delivered (_Sender)."""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                gone.set()
                if job.finished is None:
                    job.cancel(CLIENT_GONE)
                    job.events.put_nowait(("disconnect", None))
                return

    async def _next(self, job: Job) -> tuple[str, Any]:
        """The next worker event, or ("timeout", None) once the request's time is up. Raises
        ClientGone when the client hung up."""
        while True:
            limit = job.deadline if job.started is None else job.deadline + ANSWER_GRACE
            remaining = limit - time.monotonic()
            if remaining <= 0:
                if job.started is None or job.finished is None:
                    job.cancel(TIMEOUT)
                    self.state.scheduler.withdraw(job)
                    return ("timeout", None)
            try:
                kind, value = await asyncio.wait_for(job.events.get(), timeout=max(0.01, min(remaining, 1.0)))
            except asyncio.TimeoutError:
                continue
            if kind == "disconnect":
                raise ClientGone()
            return kind, value

    def _failure(self, job: Job, kind: str, value: Any, tokens: int) -> APIError | None:
        """The error this event means, or None if it is not one (a delta or a completed result).
        A cancellation caused by the client leaving is ClientGone, not an error to send."""
        err = None
        if kind == "error":
            err = as_api_error(value, job.id)
        elif kind == "timeout":
            job.cancel_reason = job.cancel_reason or TIMEOUT
            err = cancelled_error(job, tokens)
        elif kind == "done" and value.finish_reason == "cancelled":
            err = cancelled_error(job, tokens)
        if err is not None and job.cancel_reason == CLIENT_GONE:
            raise ClientGone()
        return err

    async def _single(self, job: Job, send, rid: str, out: Outcome) -> None:
        tokens = 0
        while True:
            kind, value = await self._next(job)
            if kind == "start":
                continue
            if kind == "delta":
                tokens += 1
                continue
            if kind == "done":
                out.result = value
            err = self._failure(job, kind, value, getattr(getattr(value, "stats", None), "new_tokens", tokens))
            if err is not None:
                raise err
            model = job.request.model or self.state.model_id
            body = shapes.completion_body(self.kind, rid, model, value.text, value, _queue_s(job))
            out.status = 200
            await _send_response(send, json_response(body, 200, {"X-Request-Id": rid}))
            return

    async def _stream(self, job: Job, send, rid: str, out: Outcome) -> None:
        # hold the status line until the first token or error is known, so errors keep their status code
        kind, value = "start", None
        while kind == "start":
            kind, value = await self._next(job)
        if kind == "done":
            out.result = value
        err = self._failure(job, kind, value, 0)
        if err is not None:
            raise err

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
        req = job.request
        hold = shapes.ToolHold(bool(req.tools) and req.tool_choice != "none")
        while True:
            if kind == "delta":
                out.tokens_sent += 1
                text = hold.push(value)
                if text:
                    await send({"type": "http.response.body", "body": writer.delta(text), "more_body": True})
            elif kind in ("done", "error", "timeout"):
                if kind == "done":
                    out.result = value
                n = getattr(getattr(value, "stats", None), "new_tokens", out.tokens_sent)
                err = self._failure(job, kind, value, n)
                if err is not None:  # too late for a status code: an error event, as OpenAI does
                    out.status, out.error = err.status, err.message
                    tail = writer.error(err.body())
                else:
                    calls = getattr(value, "tool_calls", None)
                    tail = writer.tool_calls(calls) if calls else writer.delta(hold.held) if hold.held else b""
                    tail += writer.final(value, _queue_s(job), job.request.include_usage)
                await send({"type": "http.response.body", "body": tail + shapes.DONE, "more_body": False})
                return
            try:
                kind, value = await self._next(job)
            except asyncio.CancelledError:
                # the server is stopping and its grace ran out before the engine's pass did: still end
                # the stream the documented way (the write goes out at once; nothing is awaited)
                err = APIError(503, f"the server shut down during this request (after {out.tokens_sent} tokens); "
                                    "retry", code="shutting_down")
                out.status, out.error = err.status, err.message
                try:
                    await send({"type": "http.response.body", "body": writer.error(err.body()) + shapes.DONE,
                                "more_body": False})
                except Exception:  # noqa: BLE001 - the connection may be gone already; we are leaving anyway
                    pass
                raise

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


class _Sender:
    """The ASGI `send` of a generation's answer, which raises ClientGone instead of writing once the client
    has hung up: the server drops what is sent after a disconnect without a word, so without this an
    answer the client never got (a stream it left before the last chunk, the engine long finished) was
    counted 200. Before the message that ends the answer it lets the event loop run twice, so that a
    hang-up already in the socket is seen (the loop reads it, then wakes the watcher)."""

    def __init__(self, send, gone: asyncio.Event) -> None:
        self._send, self.gone = send, gone

    async def __call__(self, message: dict) -> None:
        if message.get("type") == "http.response.body" and not message.get("more_body", False):
            for _ in range(2):
                await asyncio.sleep(0)
        if self.gone.is_set():
            raise ClientGone()
        await self._send(message)


async def _send_response(send, resp) -> None:
    await send({"type": "http.response.start", "status": resp.status_code, "headers": resp.raw_headers})
    await send({"type": "http.response.body", "body": resp.body})


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
