"""A fake engine with the served interface (server/served.py) and a real server around it (uvicorn on
a free port, in a thread), for the server tests: they talk to it over plain sockets and see exactly
what went over the wire. Shared here so no test module imports another."""
from __future__ import annotations

import http.client
import json
import signal
import threading
import time
from dataclasses import dataclass, field

import pytest

from edgespec.engine.requests import Options
from edgespec.engine.results import GenerationResult, GenerationStats, Ticket
from edgespec.errors import DraftUnavailable, PromptTooLong
from edgespec.server.config import ServerConfig
from edgespec.server.sdnotify import Notifier
from edgespec.server.served import ServedEngine
from edgespec.server.service import Hooks, Service

from .wait import wait_for


def wait_until(predicate, timeout=10.0, what="the condition"):
    """helpers.wait.wait_for with the argument order the server tests use. The deadline is a hang
    guard, not a measurement: nothing asserts how fast it became true."""
    return wait_for(what, predicate, timeout=timeout, every=0.005)


# --- a fake engine with the served interface --------------------------------------------------------
@dataclass
class FakePrepared:
    prompt_tokens: int
    max_new_tokens: int
    cancel: object
    kw: dict


@dataclass
class FakeRun:
    """One submitted request: its ticket, what it was prepared with, the words written so far."""

    ticket: Ticket
    prepared: FakePrepared
    words: list = field(default_factory=list)


@dataclass
class FakeEngine(ServedEngine):
    """The served engine's surface (server/served.py) with `slots` slots: each round writes one word
    (' w0 w1 ...') to every request holding a slot and takes `delay` seconds (one target pass); it
    checks each request's `cancel` at every round like the real engine. Records what it was asked and
    how each run ended."""

    delay: float = 0.0
    max_len: int = 64
    model_name: str = "fake-model"
    energy: float | None = None
    fail_with: Exception | None = None  # raised by submit: the worker's failure path
    runs: list = field(default_factory=list)  # (kwargs, finish_reason, tokens), as each run ends
    busy: threading.Event = field(default_factory=threading.Event)  # set while a request holds a slot
    slots: int = 1
    last_batch: int = 0
    docs: object = None
    pinned: object = None
    governor: object = None
    prepared: int = 0  # prepare() calls
    submitted: int = 0  # submit() calls that took a request (its ticket's id)
    waiting: list = field(default_factory=list)  # FakeRuns submitted, not yet in a slot
    active: list = field(default_factory=list)  # FakeRuns holding a slot

    def drafter_stats(self):
        return {}  # no drafters: no suffix index to report

    def count_tokens(self, prompt=None, *, messages=None):
        text = prompt if prompt is not None else " ".join(m["content"] for m in messages)
        if text == "tokenizer bug":
            raise KeyError("a bug in the tokenizer path")
        return len(text.split())

    def prepare(self, prompt=None, *, messages=None, max_new_tokens=16, cancel=None, draft=None, **kw):
        """As the real engine's prepare: every refusal here, before the request is queued."""
        self.prepared += 1
        Options(prompt=prompt, messages=messages, max_new_tokens=max_new_tokens, draft=draft, **kw)  # its checks
        if draft == "model":
            raise DraftUnavailable("draft='model' is not possible: the bundle has no draft model", param="draft")
        n = self.count_tokens(prompt, messages=messages)
        if n >= self.max_len:
            raise PromptTooLong(n, max_new_tokens, self.max_len)
        return FakePrepared(n, max_new_tokens, cancel, dict(prompt=prompt, messages=messages, draft=draft, **kw))

    def submit(self, prompt, *, on_delta=None, on_start=None):
        if self.fail_with is not None:
            raise self.fail_with
        self.submitted += 1
        t = Ticket(self.submitted, prompt.prompt_tokens, on_delta, on_start)
        self.waiting.append(FakeRun(t, prompt))
        return t

    def round(self):
        while self.waiting and len(self.active) < self.slots:
            run = self.waiting.pop(0)
            self.active.append(run)
            if run.ticket.on_start is not None:
                run.ticket.on_start()
        for run in list(self.active):
            self._check(run)
        self.last_batch = len(self.active)
        if self.active:
            self.busy.set()
            time.sleep(self.delay)  # the pass
            for run in list(self.active):
                word = f" w{len(run.words)}"
                run.words.append(word)
                if run.ticket.on_delta is not None:
                    run.ticket.on_delta(word)
                if len(run.words) >= run.prepared.max_new_tokens:
                    self._end(run, "length")
        if not self.active:
            self.busy.clear()
        return bool(self.active or self.waiting)

    def _check(self, run):
        """Before a request's pass, as the real engine: stopped, at the cache's end, or failing."""
        p = run.prepared
        if p.cancel is not None and p.cancel():
            self._end(run, "cancelled")
        elif len(run.words) >= p.max_new_tokens:
            self._end(run, "length")
        elif p.prompt_tokens + len(run.words) >= self.max_len:
            self._end(run, "cache_full")
        elif p.kw.get("seed") == 666 and len(run.words) == 1:
            self.active.remove(run)
            run.ticket.error = RuntimeError("kaboom")
            run.ticket.done.set()

    def _end(self, run, reason):
        self.active.remove(run)
        n, p = len(run.words), run.prepared
        self.runs.append((p.kw, reason, n))
        stats = GenerationStats(prompt_tokens=p.prompt_tokens, new_tokens=n, target_passes=n, drafted=2 * n,
                                accepted=n, acceptance_rate=0.5, decode_tokens_per_second=123.0,
                                drafter="fake", energy_j_per_token=self.energy)
        run.ticket.result = GenerationResult("".join(run.words), list(range(n)), reason, stats)
        run.ticket.done.set()

    def generate(self, prompt=None, **kw):
        t = self.submit(self.prepare(prompt, **kw))
        while not t.done.is_set():
            self.round()
        return t.wait(0)

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
