"""A request is prepared once, where it enters: the handler has the engine prepare it (documents,
checks, the prompt's tokens) before it is queued, so every refusal the engine makes is a 400 before
the queue, and the worker runs what was prepared without rendering or tokenizing the prompt again."""
from __future__ import annotations

import http.client
import json

import pytest

pytest.importorskip("openai", reason="the test extra is not installed (pip install .[test])")
pytest.importorskip("uvicorn", reason="the server extra is not installed (pip install .[server])")

from helpers.running import DEADLINE, RunningServer  # noqa: E402


def _post(server, body):
    conn = http.client.HTTPConnection("127.0.0.1", server.service.port, timeout=DEADLINE)
    try:
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


@pytest.mark.parametrize("parallel", [1, 2])
def test_a_chat_request_is_rendered_and_tokenized_once_on_its_way_through_the_server(tiny_bundle, monkeypatch,
                                                                                    parallel):
    from edgespec.core import chat

    r = RunningServer(tiny_bundle, parallel=parallel)
    try:
        encoded, rendered = [], []  # installed after the warm-up, which runs a chat of its own
        real_encode, real_render = chat.encode_chat, chat.render_isolated
        monkeypatch.setattr(chat, "encode_chat",
                            lambda *a, **k: encoded.append([m["content"] for m in a[2]]) or real_encode(*a, **k))
        monkeypatch.setattr(chat, "render_isolated", lambda *a, **k: rendered.append(a[1]) or real_render(*a, **k))
        msgs = [{"role": "user", "content": "a conversation rendered once on its way"}]
        out = r.client.chat.completions.create(model="qwen-agree", messages=msgs, max_tokens=3)
        assert encoded == [["a conversation rendered once on its way"]] and rendered == [1]
        # the count the worker ran with is the handler's (the Python API's count_tokens, encoding anew)
        assert out.usage.prompt_tokens == r.service.state.engine.count_tokens(messages=msgs)
    finally:
        r.stop()


@pytest.mark.parametrize("parallel,opts,body,param,says", [
    (1, {"draft": "suffix"}, {"draft": "model"}, "draft", "draft='model' is not possible"),
    (2, {"draft": "suffix"}, {"draft": "heads"}, "draft", "draft='heads' is not possible"),
], ids=["draft-model-not-loaded", "heads-not-loaded-batched"])
def test_an_engine_refusal_is_a_400_before_the_job_is_queued(tiny_bundle, parallel, opts, body, param, says):
    """draft='model' on an engine opened without the draft model, draft='heads' at --parallel 2 on a bundle
    without heads: the HTTP
    layer's own checks pass them (known names), the engine refuses them. They are answered 400 by the
    handler: the scheduler never saw them (nothing submitted, the queue as it was)."""
    r = RunningServer(tiny_bundle, parallel=parallel, engine=opts)
    sched = r.service.state.scheduler
    submitted = []
    real_submit = sched.submit
    sched.submit = lambda job: submitted.append(job.id) or real_submit(job)
    try:
        status, answer = _post(r, {"model": "qwen-agree", "max_tokens": 2, **body,
                                   "messages": [{"role": "user", "content": "hi"}]})
        assert status == 400 and answer["error"]["param"] == param, answer
        assert says in answer["error"]["message"], answer
        assert submitted == [] and sched.depth == 0
        status, _ = _post(r, {"model": "qwen-agree", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
        assert status == 200 and len(submitted) == 1  # a good one after it is queued and served
    finally:
        r.stop()
