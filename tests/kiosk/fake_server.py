"""A stand-in for `edgespec serve --ui`, for driving the kiosk page into states a real model cannot be
asked for on cue: a 500, a 429, a dropped connection mid-answer, a context-length refusal, a slow
or hanging stream. It serves the real page from the package and speaks the same HTTP API (the
streaming chat endpoint, /ready, /v1/models), and it records every request so the tests can check
what the page sent. The end-to-end test against the real server is tests/server/test_kiosk_offline.py.
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import edgespec
from helpers.wait import wait_for

STATIC = Path(edgespec.__file__).parent / "static"
CONTENT_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                 ".css": "text/css; charset=utf-8", ".png": "image/png", ".svg": "image/svg+xml"}


@dataclass
class Behaviour:
    """What the next chat requests get. Tests change it between steps."""

    # the answer, streamed one piece per `delay_s`; {n} is replaced by the request's number
    pieces: list[str] = field(default_factory=lambda: ["Hello", " from", " the", " stand-in", " server", "."])
    delay_s: float = 0.02
    status: int = 200  # non-200: answer with an OpenAI-style error body instead
    error: dict = field(default_factory=lambda: {"message": "boom", "type": "server_error"})
    retry_after: str | None = None
    drop_after: int | None = None  # close the connection after this many pieces, without [DONE]
    error_after: int | None = None  # send an error chunk (`error`) after this many pieces
    max_prompt_chars: int | None = None  # above this: 400 context_length_exceeded
    ready: bool = True
    page_status: int = 200  # what GET / answers (the kiosk launcher waits for a 200 before the browser starts)
    finish_reason: str = "stop"
    # the `edgespec` object of the last chunk, with the field names of the real server
    # (edgespec/server/shapes.py: GenerationStats as a dict plus the engine's finish_reason)
    stats: dict = field(default_factory=lambda: {
        "drafted": 12, "accepted": 9, "acceptance_rate": 0.75, "decode_tokens_per_second": 42.5,
        "ttft_s": 0.12, "drafter": "model", "finish_reason": "stop"})


@dataclass
class Seen:
    """One chat request as the server saw it."""

    body: dict
    pieces_sent: int = 0
    disconnected: bool = False
    finished: bool = False


class FakeServer:
    def __init__(self, port: int = 0, model: str = "fake-model"):
        self.behaviour = Behaviour()
        self.requests: list[Seen] = []
        self.paths: list[str] = []
        self.model = model
        self._port = port
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}/"

    def start(self) -> "FakeServer":
        server = self

        class Handler(_Handler):
            fake = server

        ThreadingHTTPServer.allow_reuse_address = True
        self._httpd = ThreadingHTTPServer(("127.0.0.1", self._port), Handler)
        self._httpd.daemon_threads = True
        self._port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Like a crashed or restarting server: the port stops answering."""
        if self._httpd:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def wait_for(self, predicate, timeout: float = 10.0, what: str = "condition"):
        """helpers.wait.wait_for with this class's argument order."""
        return wait_for(f"{what} (stand-in server)", predicate, timeout=timeout, every=0.02)


class _Handler(BaseHTTPRequestHandler):
    fake: FakeServer
    protocol_version = "HTTP/1.0"  # a stream ends by closing the connection: simplest framing

    def log_message(self, format, *args):  # keep pytest output clean
        pass

    def _send(self, status: int, body: bytes, ctype: str, headers: dict | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, obj, headers: dict | None = None) -> None:
        self._send(status, json.dumps(obj).encode(), "application/json", headers)

    def do_GET(self):
        fake = self.fake
        path = self.path.split("?", 1)[0]
        fake.paths.append(path)
        if path == "/health":
            return self._json(200, {"status": "ok"})
        if path == "/ready":
            if fake.behaviour.ready:
                return self._json(200, {"status": "ready"})
            return self._json(503, {"status": "loading"})
        if path == "/v1/models":
            return self._json(200, {"object": "list", "data": [{"id": fake.model, "object": "model"}]})
        if path == "/" and fake.behaviour.page_status != 200:
            return self._json(fake.behaviour.page_status, {"error": {"message": "not yet", "type": "server_error"}})
        name = "index.html" if path == "/" else path.lstrip("/")
        file = STATIC / name
        if "/" in name or not file.is_file():
            return self._json(404, {"error": {"message": "not found", "type": "not_found"}})
        self._send(200, file.read_bytes(), CONTENT_TYPES.get(file.suffix, "application/octet-stream"))

    def do_POST(self):
        fake = self.fake
        fake.paths.append(self.path)
        if self.path != "/v1/chat/completions":
            return self._json(404, {"error": {"message": "not found", "type": "not_found"}})
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        seen = Seen(body)
        fake.requests.append(seen)
        n = len(fake.requests)
        b = fake.behaviour
        if b.max_prompt_chars is not None:
            chars = sum(len(m.get("content", "")) for m in body.get("messages", []))
            if chars > b.max_prompt_chars:
                return self._json(400, {"error": {
                    "message": f"prompt is {chars} chars but the cache holds {b.max_prompt_chars}",
                    "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}})
        if b.status != 200:
            headers = {"Retry-After": b.retry_after} if b.retry_after else None
            return self._json(b.status, {"error": b.error}, headers)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        base = {"id": f"chatcmpl-{n}", "object": "chat.completion.chunk", "model": fake.model}
        try:
            self._event({**base, "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]})
            for i, piece in enumerate(b.pieces):
                if b.drop_after is not None and i >= b.drop_after:
                    self.wfile.flush()
                    self.connection.shutdown(2)  # the server "crashes" mid-answer
                    return
                if b.error_after is not None and i >= b.error_after:
                    self._event({"error": b.error})
                    self.wfile.write(b"data: [DONE]\n\n")
                    return
                time.sleep(b.delay_s)
                self._event({**base, "choices": [{"index": 0, "delta": {"content": piece.replace("{n}", str(n))},
                                                  "finish_reason": None}]})
                seen.pieces_sent += 1
            self._event({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": b.finish_reason}],
                         "usage": {"prompt_tokens": 7, "completion_tokens": len(b.pieces),
                                   "total_tokens": 7 + len(b.pieces)},
                         "edgespec": b.stats})
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            seen.finished = True
        except (BrokenPipeError, ConnectionResetError):
            seen.disconnected = True

    def _event(self, obj) -> None:
        self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
        self.wfile.flush()
