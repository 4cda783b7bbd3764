"""`edgespec serve --parallel 2` with a cuda-flavored bundle (a Jetson's service, several clients): the
graph has no per-row query lengths, so verifies run a pass per row (core/runner.py); every client
gets what the target alone writes. Tested on the CPU provider."""
from __future__ import annotations

import pytest

pytest.importorskip("openai", reason="the test extra is not installed (pip install .[test])")
pytest.importorskip("uvicorn", reason="the server extra is not installed (pip install .[server])")

from edgespec.engine import Engine  # noqa: E402
from helpers.running import RunningServer, together  # noqa: E402

ASKS = ["Sort a list of pairs by the second item.", "hello hello hello", "1 2 3 1 2 3 1 2"]


def test_two_clients_on_a_cuda_flavored_bundle_equal_the_target_alone(tiny_cuda_bundle):
    alone = Engine.open(tiny_cuda_bundle, max_len=256, draft="none", verify=False, warmup=False)
    r = RunningServer(tiny_cuda_bundle, parallel=2)
    try:
        assert r.service.state.engine.runner.facts.graph_flavor() == "cuda" and not r.service.state.engine.runner.one_pass

        def client(i):
            stream = r.client.chat.completions.create(
                model=r.bundle.name, messages=[{"role": "user", "content": ASKS[i]}], max_tokens=24, stream=True,
                extra_body={"draft": ["ngram", "none", "auto"][i]})
            return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

        out = together([lambda i=i: client(i) for i in range(len(ASKS))])
        for i, text in enumerate(ASKS):
            alone.reset_cache()
            want = alone.generate(messages=[{"role": "user", "content": text}], max_new_tokens=24).text
            assert out[i] == want, i
    finally:
        r.stop()
        alone.close()
