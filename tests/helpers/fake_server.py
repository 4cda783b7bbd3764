"""A fake engine with the Engine interface and a real server around it (uvicorn on a free port, in a
thread), for the server tests: they talk to it over plain sockets and see exactly what went over the
wire. Shared here so no test module imports another."""
from __future__ import annotations

import http.client
import json
import signal
import threading
import time
from dataclasses import dataclass, field

import pytest

from edgespec.engine.requests import Options
from edgespec.engine.results import GenerationResult, GenerationStats
from edgespec.errors import DraftUnavailable, PromptTooLong
from edgespec.server.config import ServerConfig
from edgespec.server.sdnotify import Notifier
from edgespec.server.served import ServedEngine, ServedStream
from edgespec.server.service import Hooks, Service

from .wait import wait_for


def wait_until(predicate, timeout=10.0, what="the condition"):
    """helpers.wait.wait_for with the argument order the server tests use. The deadline is a hang
    guard, not a measurement: nothing asserts how fast it became true."""
    return wait_for(what, predicate, timeout=timeout, every=0.005)


# --- a fake engine with the Engine interface -------------------------------------------------------
class FakeStream(ServedStream):
    def __init__(self, gen):
        self._gen = gen
        self._result = None

    def __iter__(self):
        self._result = yield from self._gen

    @property
    def result(self):
        return self._result


@dataclass
class FakePrepared:
    prompt_tokens: int
    max_new_tokens: int
    cancel: object
    kw: dict


@dataclass
class FakeEngine(ServedEngine):
    """Writes ' w0 w1 ...' one word per target pass; `delay` seconds per pass; checks `cancel` before
    each pass like the real Engine. Records what it was asked and how each run ended."""

    delay: float = 0.0
    max_len: int = 64
    model_name: str = "fake-model"
    energy: float | None = None
    fail_with: Exception | None = None
    runs: list = field(default_factory=list)  # (kwargs, finish_reason, tokens)
    busy: threading.Event = field(default_factory=threading.Event)
    slots: int = 1
    knowledge: object = None
    pinned: object = None
    governor: object = None
    prepared: int = 0  # prepare() calls

    def drafter_stats(self):
        return {}  # no drafters: no suffix index to report

    def count_tokens(self, prompt=None, *, messages=None):
        text = prompt if prompt is not None else " ".join(m["content"] for m in messages)
        if text == "tokenizer bug":
            raise KeyError("a bug in the tokenizer path")
        return len(text.split())

    def prepare(self, prompt=None, *, messages=None, max_new_tokens=16, cancel=None, draft=None, **kw):
        """As the real engines' prepare: every refusal here, before the request is queued."""
        self.prepared += 1
        Options(prompt=prompt, messages=messages, max_new_tokens=max_new_tokens, draft=draft, **kw)  # its checks
        if draft == "model":
            raise DraftUnavailable("draft='model' is not possible: the bundle has no draft model", param="draft")
        n = self.count_tokens(prompt, messages=messages)
        if n >= self.max_len:
            raise PromptTooLong(n, max_new_tokens, self.max_len)
        return FakePrepared(n, max_new_tokens, cancel, dict(prompt=prompt, messages=messages, draft=draft, **kw))

    def stream(self, prompt=None, **kw):
        p = prompt if isinstance(prompt, FakePrepared) else self.prepare(prompt, **kw)
        if self.fail_with is not None:
            raise self.fail_with
        return FakeStream(self._gen(p.prompt_tokens, p.max_new_tokens, p.cancel, p.kw))

    def _gen(self, n, max_new, cancel, kw):
        out, reason = [], "length"
        self.busy.set()
        try:
            for i in range(max_new):
                if cancel is not None and cancel():
                    reason = "cancelled"
                    break
                if n + i >= self.max_len:
                    reason = "cache_full"
                    break
                if kw.get("seed") == 666 and i == 1:
                    raise RuntimeError("kaboom")
                time.sleep(self.delay)
                out.append(f" w{i}")
                yield f" w{i}"
        finally:
            self.busy.clear()
        self.runs.append((kw, reason, len(out)))
        stats = GenerationStats(prompt_tokens=n, new_tokens=len(out), target_passes=len(out), drafted=2 * len(out),
                                accepted=len(out), acceptance_rate=0.5, decode_tokens_per_second=123.0,
                                drafter="fake", energy_j_per_token=self.energy)
        return GenerationResult("".join(out), list(range(len(out))), reason, stats)

    def generate(self, prompt=None, **kw):
        s = self.stream(prompt, **kw)
        for _ in s:
            pass
        return s.result

    def close(self):
        pass


# --- a server in a thread --------------------------------------------------------------------------
class Server:
    def __init__(self, engine=None, *, opener=None, wait_ready=True, **cfg):
        cfg.setdefault("port", 0)
        cfg.setdefault("warmup", False)
        self.engine = engine
        self.service = Service(ServerConfig(**cfg), opener or (lambda: engine), default_name="fake",
                               notifier=Notifier(environ={}), hooks=Hooks())
        self.port = self.service.port
        self.rc = None
        self.error = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        if wait_ready:
            self.wait_phase("ready")

    def _run(self):
        try:
            self.rc = self.service.run()
        except BaseException as e:  # noqa: BLE001
            self.error = e

    def wait_phase(self, phase, timeout=10):
        wait_for(f"server phase {phase}", lambda: self.service.state.phase == phase, timeout=timeout, every=0.01)

    def stop(self, timeout=15):
        if self.thread.is_alive():
            self.service.on_signal(signal.SIGTERM)
            self.thread.join(timeout)
        assert not self.thread.is_alive(), "server did not stop"

    # plain HTTP, so the test sees exactly what went over the wire
    def request(self, method, path, body=None, headers=None, timeout=10):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        headers = dict(headers or {})
        if method == "POST" and not any(k.lower() == "content-type" for k in headers):
            headers["Content-Type"] = "application/json"  # the guard requires it on every POST
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
        conn.close()
        return resp.status, resp.headers, raw  # headers: case-insensitive

    def post(self, path, body, headers=None, timeout=10):
        status, headers, raw = self.request("POST", path, body, headers, timeout)
        return status, headers, (json.loads(raw) if raw and not raw.startswith(b"data:") else raw)

    def get(self, path, headers=None):
        return self.request("GET", path, None, headers)


@pytest.fixture
def serve():
    started = []

    def start(engine=None, **kw):
        s = Server(engine if engine is not None or "opener" in kw else FakeEngine(), **kw)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


CHAT = "/v1/chat/completions"
COMP = "/v1/completions"


def chat_body(**kw):
    body = {"model": "fake", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4}
    body.update(kw)
    return body


def sse_events(raw: bytes) -> list:
    assert raw.endswith(b"data: [DONE]\n\n"), raw[-200:]
    events = []
    for block in raw.decode().split("\n\n"):
        if not block:
            continue
        assert block.startswith("data: "), block
        payload = block[len("data: "):]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def assert_openai_error(status, body, expected_status, param=None):
    assert status == expected_status, body
    assert set(body) == {"error"}
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param is not None:
        assert err["param"] == param, err
    return err
