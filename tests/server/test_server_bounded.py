"""Every endpoint bounded like generation: /v1/embeddings waits in a queue (429 past it, before its body is
read), holds a token budget (413 naming it) and runs on the engine's worker in slices between generation's
rounds; POST /v1/docs/reload is coalesced and needs the API key itself; /metrics shows each queue."""
from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import pytest

pytest.importorskip("uvicorn", reason="the server extra is not installed (pip install .[server])")

from edgespec.docs.embedder import load_embedder  # noqa: E402
from edgespec.docs.onnx_embedder import Embedded  # noqa: E402
from edgespec.server.access import check_auth  # noqa: E402
from edgespec.server.apierror import APIError  # noqa: E402
from edgespec.server.scheduler import Job, Scheduler  # noqa: E402
from edgespec.server.slices import SLICE_EVERY, SliceJob  # noqa: E402
from helpers.fake_server import CHAT, FakeEngine, assert_openai_error, chat_body, serve, wait_until  # noqa: E402,F401

EMB = "/v1/embeddings"


class BlockingEmbedder:
    """The embedder interface the endpoint uses; encode_ids waits for `gate` (a worker held mid-request)."""

    model_id = "blocking/fp32"
    dim = 4
    max_tokens = 16
    specials = [101, 102]

    def __init__(self):
        self.manifest = type("M", (), {"name": "blocking"})()
        self.gate = threading.Event()
        self.calls = 0

    def tokenize(self, text):
        return [7] * len(text.split())

    def encode(self, texts):
        return self.encode_ids([self.tokenize(t) for t in texts])

    def encode_ids(self, arrays):
        self.calls += 1
        assert self.gate.wait(10), "the test never opened the gate"
        return Embedded(np.ones((len(arrays), self.dim), np.float32) / 2, [len(a) + 2 for a in arrays],
                        [False] * len(arrays))


def _post_async(server, body, out):
    t = threading.Thread(target=lambda: out.append(server.post(EMB, body)), daemon=True)
    t.start()
    return t


def test_a_full_embeddings_queue_is_429_and_metrics_show_it(serve):  # noqa: F811
    s = serve(embed_queue_size=1)
    emb = s.service.state.embedder = BlockingEmbedder()
    queue = s.service.scheduler.embeddings
    first, second = [], []
    t1 = _post_async(s, {"model": "blocking", "input": "one two"}, first)
    wait_until(lambda: emb.calls == 1, what="the first request running")
    t2 = _post_async(s, {"model": "blocking", "input": "three"}, second)
    wait_until(lambda: queue.depth == 1, what="the second request waiting")
    status, headers, body = s.post(EMB, {"model": "blocking", "input": "four"})
    err = assert_openai_error(status, body, 429)
    assert err["code"] == "queue_full" and "embeddings queue is full (1 waiting, one running)" in err["message"]
    assert int(headers["Retry-After"]) >= 1
    metrics = s.get("/metrics")[2].decode()
    assert "edgespec_embeddings_queue_depth 1" in metrics and "edgespec_embeddings_queue_capacity 1" in metrics
    assert "edgespec_embeddings_busy 1" in metrics
    emb.gate.set()
    t1.join(10), t2.join(10)
    assert first[0][0] == 200 and second[0][0] == 200 and first[0][2]["data"][0]["embedding"] == [0.5] * 4
    assert "edgespec_embeddings_queue_depth 0" in s.get("/metrics")[2].decode()


def test_an_embeddings_request_over_the_token_budget_is_413_naming_it(serve, tiny_embedder_dir):  # noqa: F811
    s = serve(embed_max_tokens=10)
    s.service.state.embedder = e = load_embedder(tiny_embedder_dir)
    ids = e.tokenize("the museum opens at nine " * 3)
    for body in ({"model": "tiny-bert", "input": ids}, {"model": "tiny-bert", "input": ["the museum opens at nine"] * 2}):
        status, _, got = s.post(EMB, body)
        err = assert_openai_error(status, got, 413, param="input")
        assert err["code"] == "too_many_tokens" and "at most 10 per request" in err["message"], err
    status, _, got = s.post(EMB, {"model": "tiny-bert", "input": "the museum"})  # 2 words + [CLS] + [SEP]
    assert status == 200 and got["usage"]["prompt_tokens"] == 4


@dataclass
class RecordingEngine(FakeEngine):
    """The server tests' fake engine, each round recorded in `log` as the slices are."""

    log: list = field(default_factory=list)

    def round(self):
        self.log.append("d")
        return super().round()


def _slice_job(log, n, loop):
    def work():
        for _ in range(n):
            log.append("s")
            yield
        return "done"

    return SliceJob(work(), loop, loop.create_future())


@pytest.mark.parametrize("slots", [1, 2])
def test_slices_run_one_per_slice_every_rounds_while_a_request_generates(slots):
    loop = asyncio.new_event_loop()
    log: list[str] = []
    try:
        sched, engine = Scheduler(4), RecordingEngine(slots=slots, log=log)
        job = Job("j1", _Request(), loop, deadline=time.monotonic() + 60)
        job.prepared = engine.prepare("hello there", max_new_tokens=12)
        sched.submit(job)
        side = _slice_job(log, 6, loop)
        sched.embeddings.submit(side)
        sched.start(engine)
        wait_until(lambda: log.count("s") == 6 and engine.runs, what="both finished")
        sched.stop()
    finally:
        loop.close()
    assert engine.runs == [(engine.runs[0][0], "length", 12)]
    gen_part = "".join(log)
    # while the request generates (one word a round), a slice after every SLICE_EVERY rounds and never
    # two in a row; the slices left when it ends run back to back
    assert gen_part == ("d" * SLICE_EVERY + "s") * 4 + "ss", gen_part


class _Request:
    stream = True


class FakeDocs:
    """Its reloads wait for `gate` (the test holds the first one while others arrive)."""

    def __init__(self):
        self.calls, self.generation, self.path, self.gate = [], 0, "venue.idx", threading.Event()

    def reload(self):
        t0 = time.monotonic()
        assert self.gate.wait(10), "the test never opened the gate"
        self.generation += 1
        self.calls.append((t0, time.monotonic()))
        return type("I", (), {"manifest": {"counts": {"documents": 1}}, "chunks": [1, 2]})()


def test_docs_reloads_are_coalesced_and_spaced(serve):  # noqa: F811
    s = serve(reload_interval=0.5)
    kn = s.service.state.engine.docs = FakeDocs()
    gate = s.service.state.reloads
    out: list = []
    first = threading.Thread(target=lambda: out.append(s.post("/v1/docs/reload", {})))
    first.start()
    wait_until(lambda: gate.reading, what="the first reload reading")
    rest = [threading.Thread(target=lambda: out.append(s.post("/v1/docs/reload", {}))) for _ in range(5)]
    for t in rest:
        t.start()
    wait_until(lambda: gate.waiting == 6, what="five calls waiting beside the first")
    kn.gate.set()
    for t in [first, *rest]:
        t.join(15)
    assert [o[0] for o in out] == [200] * 6
    # the first call read alone; the five that came while it read share one reload, begun interval after it
    # the second began no sooner than the gate's interval after the first ended (asyncio may wake a timer
    # up to its clock resolution early: a millisecond of slack, not a tenth of the interval)
    assert len(kn.calls) == 2 and kn.calls[1][0] - kn.calls[0][1] >= gate.interval - 0.001 and gate.interval == 0.5
    assert sorted(o[2]["joined"] for o in out) == [False, False, True, True, True, True]
    assert sorted(o[2]["generation"] for o in out) == [1, 2, 2, 2, 2, 2]


def test_docs_reload_needs_the_api_key_not_the_kiosk_session():
    state = type("S", (), {"api_key": "k" * 20, "session": "sess"})()
    headers = {"cookie": "edgespec_session=sess", "host": "127.0.0.1:8000"}
    check_auth(state, headers, "127.0.0.1")  # the kiosk page's session admits a chat ...
    with pytest.raises(APIError) as e:
        check_auth(state, headers, "127.0.0.1", session=False)  # ... not an admin's reload
    assert e.value.status == 401
    check_auth(state, {"authorization": "Bearer " + "k" * 20}, "127.0.0.1", session=False)


def test_a_streaming_chat_keeps_going_while_embeddings_run(serve, tiny_embedder_dir):  # noqa: F811
    """Both finish, and the chat's deltas all arrive (the slices run between its rounds)."""
    s = serve(FakeEngine(delay=0.005))
    s.service.state.embedder = load_embedder(tiny_embedder_dir)
    got: list = []
    t = _post_async(s, {"model": "tiny-bert", "input": ["the museum opens at nine"] * 200}, got)
    status, _, raw = s.post(CHAT, chat_body(stream=True, max_tokens=30))
    t.join(30)
    assert status == 200 and raw.count(b'"content":" w') == 30
    assert got[0][0] == 200 and len(got[0][2]["data"]) == 200
