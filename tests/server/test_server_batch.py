"""`edgespec serve --parallel N`: several clients generate at once through the real `openai` client,
each getting exactly what the target alone writes; a disconnect, a timeout or SIGTERM with several
requests active ends only what it should."""
from __future__ import annotations

import json
import socket
import threading

import pytest

openai = pytest.importorskip("openai", reason="the test extra is not installed (pip install .[test])")
pytest.importorskip("uvicorn", reason="the server extra is not installed (pip install .[server])")

from edgespec.engine import Engine  # noqa: E402
from helpers.running import DEADLINE, RunningServer, together  # noqa: E402
from helpers.wait import wait_for  # noqa: E402

ASKS = ["Sort a list of pairs by the second item.", "hello hello hello", "Write fizzbuzz.", "1 2 3 1 2 3 1 2"]


def _msgs(text):
    return [{"role": "user", "content": text}]


@pytest.fixture(scope="module")
def alone(tiny_bundle):
    eng = Engine.open(tiny_bundle, max_len=256, draft="none", verify=False)
    yield eng
    eng.close()


def _ref(eng, text, n):
    eng.reset_cache()
    return eng.generate(messages=_msgs(text), max_new_tokens=n)


def test_concurrent_openai_streams_equal_target_alone(tiny_bundle, alone):
    r = RunningServer(tiny_bundle, parallel=3)
    try:
        drafts = ["none", "ngram", "auto", "suffix"]

        def client(i):
            stream = r.client.chat.completions.create(model=r.bundle.name, messages=_msgs(ASKS[i]), max_tokens=30 + i,
                                                      stream=True, extra_body={"draft": drafts[i]})
            return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

        results = together([lambda i=i: client(i) for i in range(len(ASKS))])
        for i, text in enumerate(ASKS):
            assert results[i] == _ref(alone, text, 30 + i).text, i
        body = urllib_get(r.service.port, "/metrics")
        assert "edgespec_slots 3" in body and "edgespec_batch_size" in body
        # four requests, three slots: at least one round verified more than one request
        resp = r.client.chat.completions.create(model=r.bundle.name, messages=_msgs(ASKS[0]), max_tokens=5)
        assert resp.model_extra["edgespec"]["batch_size_mean"] >= 1.0
        # what this engine did not load is the client's 400 naming the field, never a 500
        for extra, param in (({"draft": "heads"}, "draft"), ({"draft": "self"}, "draft")):
            with pytest.raises(openai.BadRequestError) as e:
                r.client.chat.completions.create(model=r.bundle.name, messages=_msgs("x"), max_tokens=3,
                                                 extra_body=extra)
            assert e.value.body["param"] == param and "is not possible" in e.value.body["message"]
    finally:
        r.stop()


def test_serve_parallel_2_draft_model_drafts_for_both_clients(tiny_bundle, alone):
    """`serve --parallel 2 --draft model --deterministic`: two clients at once, each drafted for by
    the draft model (its steps batched across them, engine/draft_batch.py), each getting exactly
    what the target alone writes (greedy). A fixed k: whether the tiny model's adaptive draft pays is
    the machine's timing."""
    from edgespec.cli.commands.serve import engine_options
    from edgespec.cli.main import build_parser

    args = build_parser().parse_args(["serve", str(tiny_bundle), "--parallel", "2", "--draft", "model",
                                      "--deterministic"])
    opts = engine_options(args)
    assert opts == {"draft": "model", "deterministic": True}
    r = RunningServer(tiny_bundle, parallel=2, engine=opts)
    try:
        assert r.service.state.engine.has_draft  # the draft model is loaded, a slot per client
        results = together([lambda i=i: r.client.chat.completions.create(model=r.bundle.name, messages=_msgs(ASKS[i]),
                                                                         max_tokens=40, extra_body={"draft_k": 3})
                           for i in range(2)])
        for i in range(2):
            got = results[i]
            assert got.choices[0].message.content == _ref(alone, ASKS[i], 40).text, i
            st = got.model_extra["edgespec"]
            assert st["drafter"] == "model" and st["rounds_by_source"].get("model", 0) > 0, st
            assert st["accepted_by_source"].get("model", 0) > 0, st
    finally:
        r.stop()


def _open_stream(port, body):
    data = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=DEADLINE)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              + f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return s


def test_disconnect_frees_its_slot_while_the_others_finish(tiny_bundle, alone):
    r = RunningServer(tiny_bundle, parallel=3, token_delay=0.01, request_timeout=30)
    try:
        sched = r.service.scheduler
        sock = _open_stream(r.service.port, {"messages": _msgs(ASKS[1]), "max_tokens": 200, "stream": True,
                                             "draft": "none"})
        got = b""
        while got.count(b"data: ") < 3:
            got += sock.recv(4096)
        out = {}

        def client(i):
            resp = r.client.chat.completions.create(model=r.bundle.name, messages=_msgs(ASKS[i]), max_tokens=40,
                                                    extra_body={"draft": "ngram"})
            out[i] = resp.choices[0].message.content

        threads = [threading.Thread(target=client, args=(i,)) for i in (0, 2)]
        for t in threads:
            t.start()
        wait_for("three requests in slots", lambda: sched.active == 3, timeout=DEADLINE)
        sock.close()  # the first client hangs up mid-stream
        wait_for("the hung-up request to leave its slot", lambda: sched.active <= 2, timeout=DEADLINE)
        for t in threads:
            t.join(DEADLINE)
        for i in (0, 2):
            assert out[i] == _ref(alone, ASKS[i], 40).text
        body = urllib_get(r.service.port, "/metrics")
        assert 'status="499"' in body
    finally:
        r.stop()


def test_timeout_ends_one_request_and_the_other_finishes(tiny_bundle, alone):
    # the long request needs ~200 rounds x 0.05 s, far past its 2 s; the short one needs 5 rounds
    r = RunningServer(tiny_bundle, parallel=2, token_delay=0.05, request_timeout=2.0)
    out = {}

    def long():
        try:
            r.client.chat.completions.create(model=r.bundle.name, messages=_msgs(ASKS[1]), max_tokens=1000,
                                             extra_body={"draft": "none"})
        except openai.APIStatusError as e:
            out["long"] = e.status_code

    def short():
        resp = r.client.chat.completions.create(model=r.bundle.name, messages=_msgs(ASKS[2]), max_tokens=5,
                                                extra_body={"draft": "ngram"})
        out["short"] = resp.choices[0].message.content

    try:
        t1 = threading.Thread(target=long)
        t1.start()
        wait_for("the long request generating", lambda: r.service.scheduler.active == 1, timeout=DEADLINE)
        t2 = threading.Thread(target=short)
        t2.start()
        t1.join(DEADLINE), t2.join(DEADLINE)
        assert out["long"] == 504
        assert out["short"] == _ref(alone, ASKS[2], 5).text
        wait_for("the timed-out request to leave its slot", lambda: r.service.scheduler.active == 0, timeout=DEADLINE)
    finally:
        r.stop()


def urllib_get(port, path):
    import urllib.request

    return urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10).read().decode()


def test_sigterm_with_several_active_requests_lets_them_finish(tiny_bundle, alone):
    r = RunningServer(tiny_bundle, parallel=2, token_delay=0.01, drain_timeout=30)
    out = {}

    def client(i):
        stream = r.client.chat.completions.create(model=r.bundle.name, messages=_msgs(ASKS[i]), max_tokens=40,
                                                  stream=True, extra_body={"draft": "none"})
        out[i] = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    threads = [threading.Thread(target=client, args=(i,)) for i in (0, 3)]
    for t in threads:
        t.start()
    wait_for("two requests generating", lambda: r.service.scheduler.active == 2, timeout=DEADLINE)
    r.stop()  # SIGTERM: both are running, both finish (nothing lost)
    for t in threads:
        t.join(DEADLINE)
    for i in (0, 3):
        assert out[i] == _ref(alone, ASKS[i], 40).text



# feature -> (bundle fixture, the server's engine options, what each client asks)
REFUSED_BEFORE = {"heads": ("tiny_heads_bundle", {"draft": "heads"}, {"draft": "heads", "draft_k": 3}),
                  "tree": ("tiny_bundle_disagree", {}, {"draft": "model", "draft_k": 3, "tree": "on"})}


@pytest.mark.parametrize("feature", list(REFUSED_BEFORE))
def test_parallel_3_server_answers_heads_and_tree_requests(request, feature):
    """draft="heads" and tree="on" at --parallel 3 (refused there before): three clients at once, each
    reply the target alone's, and each reply's stats show the heads drafted / its rounds were trees."""
    fx, opts, extra = REFUSED_BEFORE[feature]
    path = request.getfixturevalue(fx)
    ref = Engine.open(path, max_len=256, draft="none", verify=False)
    r = RunningServer(path, parallel=3, engine=opts)
    try:
        def client(i):
            resp = r.client.chat.completions.create(model=r.bundle.name, messages=_msgs(ASKS[i]), max_tokens=24,
                                                    extra_body=extra)
            return resp.choices[0].message.content, resp.model_extra["edgespec"]

        results = together([lambda i=i: client(i) for i in range(3)])
        for i in range(3):
            assert results[i][0] == _ref(ref, ASKS[i], 24).text, i
        if feature == "heads":
            assert all(st["rounds_by_source"].get("heads", 0) > 0 for _, st in results), [x[1] for x in results]
        else:
            assert all(st["tree"] == "on" and st["tree_rounds"] > 0 for _, st in results), [x[1] for x in results]
    finally:
        r.stop()
        ref.close()
