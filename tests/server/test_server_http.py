"""The HTTP layer against a small fake engine, served for real (uvicorn on a free port, plain sockets
as the client): shapes, every bad request, 413, auth, queue overflow, disconnects, timeouts, drain,
metrics, the kiosk page. The real Engine and the `openai` client are in test_server_openai.py."""
from __future__ import annotations

import asyncio
import http.client
import json
import signal
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

import pytest

pytest.importorskip("uvicorn", reason="the server extra is not installed (pip install .[server])")

from edgespec.errors import BundleCorrupt, InvalidRequest  # noqa: E402
from edgespec.server.config import ServerConfig  # noqa: E402
from edgespec.server.state import static_files  # noqa: E402
from helpers.fake_server import (  # noqa: E402
    CHAT, COMP, FakeEngine, Server, assert_openai_error, chat_body, serve, sse_events, wait_until,
)


# --- shapes ------------------------------------------------------------------------------------------
def test_chat_completion_body_usage_and_stats(serve):
    s = serve()
    t0 = time.monotonic()
    status, headers, body = s.post(CHAT, chat_body())
    elapsed = time.monotonic() - t0
    assert status == 200
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert headers["X-Request-Id"] == body["id"]
    assert body["model"] == "fake"
    (choice,) = body["choices"]
    assert choice["message"] == {"role": "assistant", "content": " w0 w1 w2 w3"}
    assert choice["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6}
    st = body["edgespec"]
    assert (st["drafted"], st["accepted"], st["acceptance_rate"]) == (8, 4, 0.5)
    # seconds this request waited for the engine: a duration within the request's own wall time
    assert st["finish_reason"] == "length" and isinstance(st["queue_s"], float) and 0 <= st["queue_s"] <= elapsed


def test_streamed_chat_is_server_sent_events_ending_with_done(serve):
    s = serve()
    status, headers, raw = s.post(CHAT, chat_body(stream=True))
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = sse_events(raw)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == " w0 w1 w2 w3"
    last = chunks[-1]
    assert last["choices"][0]["finish_reason"] == "length" and last["choices"][0]["delta"] == {}
    assert last["usage"]["completion_tokens"] == 4
    assert last["edgespec"]["accepted"] == 4 and last["edgespec"]["acceptance_rate"] == 0.5
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])


def test_stream_include_usage_adds_openai_usage_chunk(serve):
    s = serve()
    _, _, raw = s.post(CHAT, chat_body(stream=True, stream_options={"include_usage": True}))
    events = sse_events(raw)
    usage_chunk = events[-2]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["total_tokens"] == 6


def test_completions_plain_and_streamed(serve):
    s = serve()
    status, _, body = s.post(COMP, {"prompt": "a b c", "max_tokens": 3})
    assert status == 200 and body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert body["choices"][0]["text"] == " w0 w1 w2"
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
    _, _, raw = s.post(COMP, {"prompt": "a b c", "max_tokens": 3, "stream": True})
    events = sse_events(raw)[:-1]
    assert "".join(e["choices"][0]["text"] for e in events) == " w0 w1 w2"
    assert events[-1]["choices"][0]["finish_reason"] == "length" and "edgespec" in events[-1]


def test_engine_receives_the_validated_arguments(serve):
    eng = FakeEngine()
    s = serve(eng)
    s.post(CHAT, chat_body(temperature=0.7, top_p=0.9, top_k=4, seed=5, stop=["x"], draft="ngram", draft_k=2))
    kw, _, _ = eng.runs[-1]
    assert kw["messages"] == [{"role": "user", "content": "hello there"}]
    assert (kw["temperature"], kw["top_p"], kw["top_k"], kw["seed"], kw["stop"], kw["draft"], kw["k"]) == (
        0.7, 0.9, 4, 5, ["x"], "ngram", 2)


def test_models_health_ready(serve):
    s = serve()
    status, _, raw = s.get("/v1/models")
    body = json.loads(raw)
    assert status == 200 and body["object"] == "list" and [m["id"] for m in body["data"]] == ["fake"]
    assert s.get("/v1/models/fake")[0] == 200
    assert s.get("/v1/models/fake-model")[0] == 200  # the engine's own name is an alias
    assert s.get("/v1/models/other")[0] == 404
    assert s.get("/health")[0] == 200
    status, _, raw = s.get("/ready")
    assert status == 200 and json.loads(raw) == {"status": "ready", "model": "fake"}
    # the engine's model_name is accepted in requests too
    assert s.post(CHAT, chat_body(model="fake-model"))[0] == 200


def test_model_name_option_sets_the_id(serve):
    s = serve(model_names=["coder", "alias"])
    assert [m["id"] for m in json.loads(s.get("/v1/models")[2])["data"]] == ["coder"]
    assert s.post(CHAT, chat_body(model="alias"))[0] == 200
    status, _, body = s.post(CHAT, chat_body(model="nope"))
    assert "'coder'" in assert_openai_error(status, body, 400, "model")["message"]


# --- bad requests ----------------------------------------------------------------------------------
BAD = [
    (CHAT, b"{not json", None),
    (CHAT, b"", None),
    (CHAT, b"[1, 2]", None),
    (CHAT, b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}', None),
    (CHAT, {"model": "fake"}, "messages"),
    (CHAT, chat_body(messages=[{"role": "user", "content": 7}]), "messages[0].content"),
    (CHAT, chat_body(max_tokens=0), "max_tokens"),
    (CHAT, chat_body(max_tokens=-1), "max_tokens"),
    (CHAT, chat_body(max_tokens=10**9), "max_tokens"),
    (CHAT, chat_body(max_tokens="5"), "max_tokens"),
    (CHAT, chat_body(model="gpt-4o"), "model"),
    (CHAT, chat_body(temperature=5), "temperature"),
    (CHAT, chat_body(top_p=0), "top_p"),
    (CHAT, chat_body(top_k=-2), "top_k"),
    (CHAT, chat_body(seed=-1), "seed"),
    (CHAT, chat_body(n=3), "n"),
    (CHAT, chat_body(stream=True, max_tokens=0), "max_tokens"),  # a stream's error is still a status
    (CHAT, chat_body(messages=[{"role": "user", "content": " ".join(["w"] * 200)}]), "messages"),  # too long
    (CHAT, chat_body(stream=True, messages=[{"role": "user", "content": " ".join(["w"] * 200)}]), "messages"),
    (CHAT, chat_body(draft="model"), "draft"),  # raised by the engine itself
    (COMP, {"prompt": 12}, "prompt"),
    (COMP, {"max_tokens": 3}, "prompt"),
    (COMP, {"prompt": " ".join(["w"] * 64)}, "prompt"),
]


@pytest.fixture(scope="module")
def shared():
    """One server for the tests that leave no state behind (saves a start and a stop per case)."""
    s = Server(FakeEngine())
    yield s
    s.stop()


@pytest.mark.parametrize("path, body, param", BAD)
def test_bad_request_is_400_and_the_next_request_is_served(shared, path, body, param):
    s = shared
    status, headers, err = s.post(path, body)
    e = assert_openai_error(status, err, 400, param)
    assert e["type"] == "invalid_request_error"
    assert headers["content-type"] == "application/json"
    status, _, ok = s.post(CHAT, chat_body())
    assert status == 200 and ok["choices"][0]["message"]["content"] == " w0 w1 w2 w3"


def test_prompt_too_long_uses_openai_code(serve):
    s = serve()
    status, _, body = s.post(CHAT, chat_body(messages=[{"role": "user", "content": "w " * 100}]))
    err = assert_openai_error(status, body, 400, "messages")
    assert err["code"] == "context_length_exceeded" and "100 tokens" in err["message"] and "64" in err["message"]


def test_max_tokens_beyond_the_cache_ends_with_length(serve):
    """Not a 400: the limit is --max-tokens-limit; running out of cache is a normal end (the kiosk
    page asks for 512 tokens whatever the board's cache)."""
    s = serve(max_tokens_limit=4096)
    status, _, body = s.post(CHAT, chat_body(max_tokens=500))
    assert status == 200 and body["choices"][0]["finish_reason"] == "length"
    assert body["edgespec"]["finish_reason"] == "cache_full" and body["usage"]["completion_tokens"] == 62
    status, _, body = s.post(CHAT, chat_body(max_tokens=4097))
    assert "at most 4096" in assert_openai_error(status, body, 400, "max_tokens")["message"]


def test_oversized_body_is_413_then_served_normally(serve):
    s = serve(max_body_bytes=4096)
    big = chat_body(messages=[{"role": "user", "content": "x" * 10_000}])
    status, _, body = s.post(CHAT, big)
    assert "4096 bytes" in assert_openai_error(status, body, 413)["message"]
    # without Content-Length (chunked): counted while reading
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=10)
    conn.request("POST", CHAT, body=iter([b'{"messages": "', b"y" * 8000, b'"}']), encode_chunked=True,
                 headers={"Transfer-Encoding": "chunked", "Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 413 and json.loads(resp.read())["error"]["type"] == "invalid_request_error"
    conn.close()
    assert s.post(CHAT, chat_body())[0] == 200


def test_unknown_path_and_wrong_method_are_json_errors(serve):
    s = serve()
    status, _, raw = s.get("/v1/moderations")  # not served (/v1/embeddings is: a GET there is 405)
    assert_openai_error(status, json.loads(raw), 404)
    status, _, raw = s.get(CHAT)
    assert_openai_error(status, json.loads(raw), 405)
    status, _, raw = s.request("POST", "/health", b"{}")
    assert_openai_error(status, json.loads(raw), 405)


def test_engine_failure_is_500_and_the_server_lives_on(serve):
    eng = FakeEngine()
    s = serve(eng)
    status, _, body = s.post(CHAT, chat_body(seed=666))  # the fake raises RuntimeError mid-generation
    err = assert_openai_error(status, body, 500)
    assert err["type"] == "server_error" and "RuntimeError" in err["message"]
    status, _, raw = s.post(CHAT, chat_body(seed=666, stream=True))  # mid-stream: an error event
    events = sse_events(raw)
    assert events[-2]["error"]["type"] == "server_error"
    assert s.post(CHAT, chat_body())[0] == 200


def test_failure_before_the_queue_is_500_json(serve):
    s = serve()
    status, _, body = s.post(CHAT, chat_body(messages=[{"role": "user", "content": "tokenizer bug"}]))
    assert "KeyError" in assert_openai_error(status, body, 500)["message"]
    assert s.post(CHAT, chat_body())[0] == 200


class _StuckEngine(FakeEngine):
    """A round that waits for `gate` (a pass that never ends, until the test lets it), or raises
    SystemExit, which the worker does not catch (only Exception): its thread ends (a dead worker)."""

    def __init__(self, *, die=False):
        super().__init__()
        self.gate, self.die, self.inside = threading.Event(), die, threading.Event()

    def round(self):
        if self.die:
            raise SystemExit
        self.inside.set()
        assert self.gate.wait(10), "the test never opened the gate"
        return super().round()


def _one_job(eng):
    from edgespec.server.scheduler import Job
    from edgespec.server.validate import GenRequest

    job = Job("j", GenRequest(kind="chat", model="m", max_tokens=1), loop=asyncio.new_event_loop(),
              deadline=time.monotonic() + 60)
    job.prepared = eng.prepare("hi", max_new_tokens=1)
    return job


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the worker dies on purpose
def test_stuck_or_dead_worker_is_unhealthy():
    """Healthy means: no slot held, or a round finished within the stall time; a dead worker never is."""
    from edgespec.server.scheduler import Scheduler

    sched, eng = Scheduler(2), _StuckEngine()
    assert sched.healthy(10)
    job = _one_job(eng)
    sched.submit(job)
    sched.start(eng)
    assert eng.inside.wait(10)  # one pass holds the engine
    assert sched.active == 1 and not sched.healthy(0) and sched.healthy(3600)
    eng.gate.set()
    wait_until(lambda: sched.active == 0, what="the job to finish")
    assert eng.runs[0][1:] == ("length", 1) and sched.healthy(0)  # nothing held: healthy at any stall time
    assert sched.stop()
    job.loop.close()

    dead, eng = Scheduler(2), _StuckEngine(die=True)
    job = _one_job(eng)
    dead.submit(job)
    dead.start(eng)
    wait_until(lambda: not dead.healthy(3600), what="the dead worker to be unhealthy")  # only a restart helps
    job.loop.close()


# --- security --------------------------------------------------------------------------------------
def test_bearer_token_from_a_file(serve, tmp_path):
    key = tmp_path / "key"
    key.write_text("s3cret-token-0123456789\n")
    key.chmod(0o600)
    s = serve(api_key_file=str(key))
    for headers in ({}, {"Authorization": "Bearer wrong-token-0123456789"}, {"Authorization": "Basic abc"}):
        status, h, body = s.post(CHAT, chat_body(), headers)
        assert assert_openai_error(status, body, 401)["code"] == "invalid_api_key"
        assert h["www-authenticate"] == "Bearer"
    assert s.get("/v1/models")[0] == 401 and s.get("/metrics")[0] == 401
    assert s.get("/health")[0] == 200 and s.get("/ready")[0] == 200  # probes stay open
    auth = {"Authorization": "Bearer s3cret-token-0123456789"}
    assert s.post(CHAT, chat_body(), auth)[0] == 200
    assert s.get("/metrics", auth)[0] == 200


@pytest.mark.parametrize("content, message", [("", "empty"), ("short", "too short"), ("two words-0123456789", "spaces")])
def test_bad_api_key_file_is_refused_at_start(tmp_path, content, message):
    from edgespec.server.config import ConfigError

    key = tmp_path / "key"
    key.write_text(content)
    with pytest.raises(ConfigError, match=message):
        Server(FakeEngine(), api_key_file=str(key), wait_ready=False)
    with pytest.raises(ConfigError, match="does not exist"):
        Server(FakeEngine(), api_key_file=str(tmp_path / "missing"), wait_ready=False)


def test_api_key_from_systemd_credentials(monkeypatch, tmp_path, serve):
    (tmp_path / "api-key").write_text("credential-token-0123456789")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    s = serve()
    assert s.post(CHAT, chat_body())[0] == 401
    assert s.post(CHAT, chat_body(), {"Authorization": "Bearer credential-token-0123456789"})[0] == 200


def test_binds_loopback_by_default():
    cfg = ServerConfig()
    assert cfg.host == "127.0.0.1"


# --- queue, disconnects, timeouts -------------------------------------------------------------------
def _background_post(s, body, results, key):
    def go():
        results[key] = s.post(CHAT, body, timeout=30)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def test_full_queue_answers_429_with_retry_after(serve):
    eng = FakeEngine(delay=0.05)
    s = serve(eng, queue_size=1)
    results = {}
    t1 = _background_post(s, chat_body(max_tokens=10), results, "running")
    assert eng.busy.wait(5)
    t2 = _background_post(s, chat_body(max_tokens=2), results, "queued")
    wait_until(lambda: s.service.scheduler.depth >= 1, what="a request in the queue")
    status, headers, body = s.post(CHAT, chat_body())
    err = assert_openai_error(status, body, 429)
    assert err["type"] == "rate_limit_error" and err["code"] == "queue_full"
    assert int(headers["retry-after"]) >= 1
    t1.join(10), t2.join(10)
    assert results["running"][0] == 200 and results["queued"][0] == 200
    assert results["queued"][2]["choices"][0]["message"]["content"] == " w0 w1"
    assert s.post(CHAT, chat_body())[0] == 200
    metrics = s.get("/metrics")[2].decode()
    assert 'edgespec_requests_total{endpoint="chat",status="429"} 1' in metrics


def _open_stream(port, body):
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    data = json.dumps(body).encode()
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
    return sock


def _wait_runs(eng, n, timeout=10):
    wait_until(lambda: len(eng.runs) >= n, timeout, what=f"{n} finished engine run(s)")
    return eng.runs[n - 1]


def test_client_disconnect_mid_stream_cancels_and_frees_the_engine(serve):
    eng = FakeEngine(delay=0.05)
    s = serve(eng)
    sock = _open_stream(s.port, chat_body(stream=True, max_tokens=60))
    got = b""
    while got.count(b"data: ") < 3:  # the role chunk and two words
        got += sock.recv(4096)
    sock.close()
    kw, reason, tokens = _wait_runs(eng, 1)
    assert reason == "cancelled" and tokens < 60  # stopped at a pass boundary, not run to the end
    sched = s.service.scheduler
    wait_until(lambda: sched.running is None and sched.depth == 0, what="the engine to be free")
    status, _, body = s.post(CHAT, chat_body(max_tokens=2))
    assert status == 200 and eng.runs[1][1:] == ("length", 2)  # served in full, right after
    assert 'status="499"' in s.get("/metrics")[2].decode()  # logged as "client closed request"


@pytest.mark.parametrize("path, endpoint", [(CHAT, "chat"), ("/v1/completions", "completions")])
def test_a_stream_the_client_leaves_before_its_last_chunk_is_499_even_when_generation_finished(serve, path, endpoint):
    """The engine finished long before the client left (every token queued for the stream, the job done),
    but the client read only the first chunks before hanging up: the stream was not delivered, so it is
    counted 499, not 200. (A client that stops reading makes the server wait to write; the hang-up
    ends the wait, and what is left of the stream is not sent.)"""
    eng = FakeEngine(max_len=20_000)
    s = serve(eng, max_tokens_limit=10_000)
    body = chat_body(stream=True, max_tokens=10_000) if endpoint == "chat" else \
        {"prompt": "hello there", "stream": True, "max_tokens": 10_000}
    data = json.dumps(body).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a slow reader: the server's writes back up
    sock.settimeout(10)
    sock.connect(("127.0.0.1", s.port))
    conns = s.service.server.server_state.connections
    wait_until(lambda: len(conns) == 1, what="the server to take the connection")
    next(iter(conns)).transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    got = b""
    while b"data: " not in got:
        got += sock.recv(1024)
    assert got.startswith(b"HTTP/1.1 200")
    _wait_runs(eng, 1)  # the engine is done: every chunk is queued or written
    assert eng.runs[0][1:] == ("length", 10_000)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # a hang-up, unread data dropped
    sock.close()
    m = s.service.state.metrics
    wait_until(lambda: m.requests[(endpoint, 499)] + m.requests[(endpoint, 200)] >= 1, what="the stream to be counted")
    assert (m.requests[(endpoint, 499)], m.requests[(endpoint, 200)]) == (1, 0)


def test_client_disconnect_while_waiting_in_the_queue_never_runs(serve):
    eng = FakeEngine(delay=0.05)
    s = serve(eng, queue_size=4)
    results = {}
    t = _background_post(s, chat_body(max_tokens=10), results, "running")
    assert eng.busy.wait(5)
    sock = _open_stream(s.port, chat_body(max_tokens=5, messages=[{"role": "user", "content": "queued one"}]))
    wait_until(lambda: s.service.scheduler.depth >= 1, what="the second request to be queued")
    sock.close()
    wait_until(lambda: s.service.scheduler.depth == 0, what="the hung-up request to be withdrawn")
    t.join(10)
    assert results["running"][0] == 200
    # the queue is first in, first out: once a later request has run, the withdrawn one would have run
    # before it if it were still there
    assert s.post(CHAT, chat_body(max_tokens=1, messages=[{"role": "user", "content": "after"}]))[0] == 200
    assert [r[0]["messages"][0]["content"] for r in eng.runs] == ["hello there", "after"]


def test_client_disconnect_during_non_streamed_generation_cancels(serve):
    eng = FakeEngine(delay=0.05)
    s = serve(eng)
    sock = _open_stream(s.port, chat_body(max_tokens=60))
    assert eng.busy.wait(5)  # generating now
    sock.close()
    _, reason, tokens = _wait_runs(eng, 1)
    assert reason == "cancelled" and tokens < 60


def test_request_timeout_is_504_and_frees_the_engine(serve):
    eng = FakeEngine(delay=0.05)
    s = serve(eng, request_timeout=0.5)
    status, _, body = s.post(CHAT, chat_body(max_tokens=60))
    err = assert_openai_error(status, body, 504)
    assert err["type"] == "timeout_error" and "0.5 s" in err["message"]
    _, reason, tokens = _wait_runs(eng, 1)
    assert reason == "cancelled" and tokens < 60  # the engine was stopped, not left running
    status, _, raw = s.post(CHAT, chat_body(max_tokens=60, stream=True))  # after the 200: an error event
    events = sse_events(raw)
    assert events[-2]["error"]["code"] == "timeout" and events[1]["choices"][0]["delta"]["content"] == " w0"
    assert s.post(CHAT, chat_body(max_tokens=2))[0] == 200


def test_queued_request_times_out_in_the_queue(serve):
    eng = FakeEngine(delay=1.5)  # one long pass (a big prefill): the queued request's time runs out
    s = serve(eng, request_timeout=0.6)
    results = {}
    t = _background_post(s, chat_body(max_tokens=1), results, "running")
    assert eng.busy.wait(5)
    status, _, body = s.post(CHAT, chat_body(max_tokens=2))
    assert "in the queue" in assert_openai_error(status, body, 504)["message"]
    t.join(10)
    assert results["running"][0] == 200  # a pass in progress is never cut
    assert len(eng.runs) == 1  # the timed-out request never reached the engine


# --- lifecycle -----------------------------------------------------------------------------------------
def test_loading_phase_health_ok_ready_503(serve):
    release = threading.Event()
    eng = FakeEngine()

    def opener():
        release.wait(10)
        return eng

    s = serve(opener=opener, wait_ready=False)
    assert s.get("/health")[0] == 200
    status, headers, raw = s.get("/ready")
    assert status == 503 and json.loads(raw)["status"] == "loading" and headers["retry-after"] == "5"
    status, headers, body = s.post(CHAT, chat_body())
    assert assert_openai_error(status, body, 503)["code"] == "model_loading" and headers["retry-after"] == "5"
    release.set()
    s.wait_phase("ready")
    assert s.get("/ready")[0] == 200 and s.post(CHAT, chat_body())[0] == 200


def test_load_failure_stops_the_server_with_the_error():
    def opener():
        raise BundleCorrupt("/b", ["target/model.onnx: sha256 mismatch"])

    s = Server(opener=opener, wait_ready=False)
    s.thread.join(10)
    assert isinstance(s.error, BundleCorrupt) and s.service.state.phase == "failed"


def test_warmup_runs_before_ready():
    eng = FakeEngine()
    s = Server(eng, warmup=True)
    try:
        assert len(eng.runs) == 1 and eng.runs[0][0]["messages"] == [{"role": "user", "content": "Hi"}]
    finally:
        s.stop()


@pytest.mark.parametrize("chat", [True, False], ids=["chat-template", "no-template"])
def test_warmup_with_a_pinned_prompt_is_a_visitors_conversation(chat):
    """`--system-prompt`: the warm-up starts with the pinned prompt, so it leaves the prompt's rows
    in the cache for the first visitor (tests/engine/test_pinned.py checks the cache itself); for a
    bundle without a chat template the pinned prefix is the prompt's text, and so is the warm-up's."""
    from edgespec.engine.pinned import PinnedPrefix

    eng = FakeEngine()
    eng.pinned = PinnedPrefix([], None, text="You are the museum's guide.", chat=chat)
    s = Server(eng, warmup=True)
    try:
        if chat:
            assert [(r[0]["messages"], r[0]["prompt"]) for r in eng.runs] == [([
                {"role": "system", "content": "You are the museum's guide."}, {"role": "user", "content": "Hi"}], None)]
        else:
            assert [(r[0]["messages"], r[0]["prompt"]) for r in eng.runs] == [(None, "You are the museum's guide.Hi")]
    finally:
        s.stop()


def test_the_worker_thread_is_started_before_the_first_request_is_read(monkeypatch):
    """The loop's first run_in_threadpool pays anyio's one-off set-up (~30 ms), and every request
    counts its tokens there: the server pays it before it accepts a connection, not the first visitor."""
    import edgespec.server.service as service_mod

    accepting = []
    real = service_mod.prime_thread_pool
    holder = {}

    async def spy():
        await real()
        accepting.append(holder["service"].server.started)

    monkeypatch.setattr(service_mod, "prime_thread_pool", spy)
    real_init = service_mod.Service.__init__

    def init(self, *a, **kw):
        real_init(self, *a, **kw)
        holder["service"] = self

    monkeypatch.setattr(service_mod.Service, "__init__", init)
    s = Server(FakeEngine())
    try:
        assert accepting == [False]  # once, before uvicorn started serving
        status, _, body = s.post(CHAT, chat_body())
        assert status == 200 and body["usage"]["completion_tokens"] == 4
    finally:
        s.stop()


def test_sigterm_drain_finishes_running_503s_queued_exits_0(serve):
    eng = FakeEngine(delay=0.05)
    s = serve(eng, queue_size=4, drain_timeout=10)
    results = {}
    t1 = _background_post(s, chat_body(max_tokens=20), results, "running")
    assert eng.busy.wait(5)
    t2 = _background_post(s, chat_body(max_tokens=2), results, "queued")
    wait_until(lambda: s.service.scheduler.depth >= 1, what="a request in the queue")
    s.service.on_signal(signal.SIGTERM)
    t1.join(10), t2.join(10)
    s.thread.join(10)
    assert not s.thread.is_alive() and s.rc == 0
    assert results["running"][0] == 200 and results["running"][2]["usage"]["completion_tokens"] == 20
    status, headers, body = results["queued"]
    assert assert_openai_error(status, body, 503)["code"] == "shutting_down" and headers["retry-after"] == "5"


def test_sigterm_drain_cancels_running_request_at_the_deadline(serve):
    eng = FakeEngine(delay=0.05)
    s = serve(eng, drain_timeout=0.3)
    results = {}
    t1 = _background_post(s, chat_body(max_tokens=60), results, "running")
    assert eng.busy.wait(5)
    s.service.on_signal(signal.SIGTERM)
    t1.join(10)
    s.thread.join(10)
    assert not s.thread.is_alive() and s.rc == 0
    status, _, body = results["running"]
    assert "shut down" in assert_openai_error(status, body, 503)["message"]
    assert eng.runs[-1][1] == "cancelled" and eng.runs[-1][2] < 60  # cut at the deadline, not finished


# --- metrics ---------------------------------------------------------------------------------------------
def test_metrics_are_prometheus_text(serve):
    eng = FakeEngine(energy=0.25)
    s = serve(eng)
    s.post(CHAT, chat_body())
    s.post(CHAT, chat_body(stream=True))
    s.post(CHAT, chat_body(max_tokens=0))
    status, headers, raw = s.get("/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4")
    text = raw.decode()
    lines = text.splitlines()
    for line in lines:  # every sample line is "name{labels} value" with a float value
        if not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            float(value)
    assert 'edgespec_requests_total{endpoint="chat",status="200"} 2' in lines
    assert 'edgespec_requests_total{endpoint="chat",status="400"} 1' in lines
    assert "edgespec_completion_tokens_total 8" in lines
    assert "edgespec_prompt_tokens_total 4" in lines
    assert "edgespec_drafted_tokens_total 16" in lines and "edgespec_accepted_tokens_total 8" in lines
    assert "edgespec_acceptance_rate 0.5" in lines
    assert "edgespec_tokens_per_second 123.0" in lines
    assert "edgespec_energy_joules_per_token 0.25" in lines
    assert "edgespec_queue_depth 0" in lines and "edgespec_queue_capacity 8" in lines
    assert "edgespec_ready 1" in lines
    assert "edgespec_time_to_first_token_seconds_count 2" in lines
    assert 'edgespec_time_to_first_token_seconds_bucket{le="+Inf"} 2' in lines
    assert "# TYPE edgespec_time_to_first_token_seconds histogram" in lines


def test_no_energy_metric_without_a_power_sensor(serve):
    s = serve(FakeEngine(energy=None))
    s.post(CHAT, chat_body())
    assert "edgespec_energy_joules_per_token" not in s.get("/metrics")[2].decode()


def test_one_log_line_per_request(serve, caplog):
    s = serve()
    caplog.set_level("INFO", logger="edgespec.server.requests")
    _, _, body = s.post(CHAT, chat_body())
    s.post(CHAT, chat_body(max_tokens=0))
    def lines():
        return [r.getMessage() for r in caplog.records if r.name == "edgespec.server.requests"]

    wait_until(lambda: len(lines()) >= 2, what="two request log lines")  # written just after the answer
    lines = lines()
    assert len(lines) == 2
    ok, bad = lines
    assert ok.startswith(f"req={body['id']} endpoint=chat status=200 stream=0 prompt_tokens=2 completion_tokens=4 tok_s=123")
    assert "accepted=4" in ok and "accept=0.500" in ok and "\x1b" not in ok
    assert "status=400" in bad and 'error="' in bad


# --- the kiosk page ---------------------------------------------------------------------------------------
def test_ui_off_by_default(serve):
    s = serve()
    status, _, raw = s.get("/")
    assert status == 200 and json.loads(raw)["service"] == "edgespec"
    assert s.get("/index.html")[0] == 404


def test_ui_serves_package_files_only(serve):
    files = static_files(__import__("edgespec.server.state", fromlist=["STATIC_DIR"]).STATIC_DIR)
    if "/" not in files:
        pytest.skip("the kiosk page (edgespec/static/index.html) is not in this checkout")
    s = serve(ui=True)
    status, headers, raw = s.get("/")
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert raw == files["/"].read_bytes()
    for path in files:
        assert s.get(path)[0] == 200
    for evil in ("/../server/app.py", "/static/../server/app.py", "/%2e%2e/server/app.py", "/..%2fserver%2fapp.py",
                 "/static/%2e%2e%2f%2e%2e%2fpyproject.toml", "//etc/passwd", "/etc/passwd", "/static//etc/passwd"):
        status, _, raw = s.get(evil)
        assert status == 404, evil


def test_ready_carries_the_pinned_system_prompt_to_the_kiosk_page_only(serve):
    """serve --system-prompt: /ready names the pinned prompt when the page is served (the page sends it
    back as its system message); a plain API server does not show it to unauthenticated callers."""
    from edgespec.engine.pinned import PinnedPrefix

    eng = FakeEngine()
    eng.pinned = PinnedPrefix([], None, text="You are the museum's guide.")
    files = static_files(__import__("edgespec.server.state", fromlist=["STATIC_DIR"]).STATIC_DIR)
    if "/" in files:
        s = serve(engine=eng, ui=True)
        body = json.loads(s.get("/ready")[2])
        assert body == {"status": "ready", "model": "fake", "system_prompt": "You are the museum's guide."}
    s = serve(engine=eng)
    assert "system_prompt" not in json.loads(s.get("/ready")[2])


def test_static_table_lists_regular_files_only(tmp_path):
    (tmp_path / "index.html").write_text("<p>hi</p>")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.js").write_text("1")
    (tmp_path / ".hidden").write_text("no")
    (tmp_path / "link.txt").symlink_to("/etc/hostname")
    files = static_files(tmp_path)
    assert set(files) == {"/", "/index.html", "/static/index.html", "/a/x.js", "/static/a/x.js"}


def test_ui_without_the_page_is_a_config_error(monkeypatch, tmp_path):
    from edgespec.server import state
    from edgespec.server.config import ConfigError

    monkeypatch.setattr(state, "STATIC_DIR", tmp_path)
    with pytest.raises(ConfigError, match="kiosk page"):
        Server(FakeEngine(), ui=True, wait_ready=False)


def test_bad_config_values_are_refused():
    from edgespec.server.config import ConfigError

    for kw in ({"request_timeout": 0}, {"queue_size": -1}, {"max_body_bytes": 10}, {"default_temperature": 3}):
        with pytest.raises(ConfigError):
            ServerConfig(**kw).check()


def test_engine_invalid_request_maps_to_400(serve):
    eng = FakeEngine(fail_with=InvalidRequest("stop strings must not be empty", param="stop"))
    s = serve(eng)
    status, _, body = s.post(CHAT, chat_body())
    assert assert_openai_error(status, body, 400, "stop")["message"] == "stop strings must not be empty"


def test_a_stream_cut_by_the_shutdown_grace_still_ends_with_an_error_and_done(serve, monkeypatch):
    """The drain cancels the running request at its deadline, but an engine pass that outlasts the
    shutdown grace too is cut by uvicorn (the handler task is cancelled): the stream still ends with
    an error event and [DONE], not mid-air."""
    from edgespec.server import service

    monkeypatch.setattr(service, "SHUTDOWN_GRACE", 0.0)
    engine = FakeEngine(delay=0.3)
    s = serve(engine, drain_timeout=1.0)
    out = {}

    def stream():
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
        conn.request("POST", CHAT, body=json.dumps(chat_body(stream=True, max_tokens=50)),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        out["raw"] = resp.read()

    t = threading.Thread(target=stream, daemon=True)
    t.start()
    wait_until(lambda: engine.busy.is_set(), what="the stream to start generating")
    engine.delay = 8.0  # the next pass outlasts the drain (1 s) and the grace (0)
    s.stop(timeout=30)
    t.join(30)
    events = sse_events(out["raw"])
    assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "shutting_down"


def test_reload_api_key_keeps_the_key_in_force_on_a_bad_file(serve, tmp_path):
    """What SIGHUP runs (the signal itself: test_server_process.py). A key cannot be switched on by it,
    and a missing, short or empty file leaves the key in force."""
    key = tmp_path / "key"
    key.write_text("first-key-0123456789abcdef")
    key.chmod(0o600)
    s = serve(api_key_file=str(key))
    auth = lambda k: {"Authorization": f"Bearer {k}"}  # noqa: E731
    for bad in ("short", "", None):
        if bad is None:
            key.unlink()
        else:
            key.write_text(bad)
        assert s.service.reload_api_key() is False
        assert s.get("/v1/models", headers=auth("first-key-0123456789abcdef"))[0] == 200
    key.write_text("second-key-0123456789abcdef")
    assert s.service.reload_api_key() is True
    assert s.get("/v1/models", headers=auth("second-key-0123456789abcdef"))[0] == 200
    assert s.get("/v1/models", headers=auth("first-key-0123456789abcdef"))[0] == 401
    open_server = serve()
    assert open_server.service.reload_api_key() is False and open_server.get("/v1/models")[0] == 200
