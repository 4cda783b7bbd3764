"""Several requests on a graph without per-row query lengths (the cuda flavor; a cpu graph on an
onnxruntime older than 1.32.0): one-token steps in one pass, longer ones a pass per row
(core/runner.py). Each request gets exactly what it gets alone, greedy and seeded. Tested on
the CPU provider (the cuda-flavored graph runs there in float16)."""
from __future__ import annotations

import onnxruntime
import pytest

from edgespec.engine import Engine
from edgespec.models import ortcompat
from edgespec.models.kernels import floor_problem
from helpers.batch import generate_all

cuda_floor = pytest.mark.skipif(floor_problem(onnxruntime.__version__, "cuda") is not None,
                                reason=f"onnxruntime {onnxruntime.__version__} is below the cuda flavor's floor")

PROMPTS = ["def add(a, b):\n    return a + b\n\ndef add(a, b):", "hello hello hello world",
           "the quick brown fox jumps over the lazy dog. the quick brown", "1 2 3 4 5 6 7 8 9 10 1 2 3"]
OLD_SCHEMA = ("query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length", "cos_cache",
              "sin_cache", "position_ids", "attention_bias", "head_sink")  # onnxruntime 1.23.2's and 1.24.1's


def _alone(eng, **kw):
    eng.reset_cache()
    return eng.generate(**kw)


def _check(bundle, reqs, **open_kw) -> list[list[int]]:
    """Runs `reqs` batched and alone; returns each batched step's row lengths."""
    be = Engine.open(bundle, parallel=3, max_len=160, verify=False, providers="cpu", **open_kw)
    alone = Engine.open(bundle, draft="none", max_len=160, verify=False, warmup=False, providers="cpu")
    steps: list[list[int]] = []
    step = be.runner.step
    be.runner.step = lambda rows: steps.append([len(t) for t in rows.values()]) or step(rows)
    try:
        assert not be.runner.one_pass  # the per-row path, not the padded-queries one
        got = generate_all(be, reqs)
        for r, g in zip(reqs, got):
            want = _alone(alone, tree="off", **r)
            assert g.token_ids == want.token_ids, r
            assert g.finish_reason == want.finish_reason
        return steps
    finally:
        alone.close()


@cuda_floor
@pytest.mark.parametrize("draft,k", [("none", None), ("ngram", 3), ("auto", None)])
def test_cuda_flavor_greedy_batch_equals_alone(tiny_cuda_bundle, draft, k):
    reqs = [dict(prompt=p, max_new_tokens=20 + 5 * i, draft=draft, k=k) for i, p in enumerate(PROMPTS)]
    steps = _check(tiny_cuda_bundle, reqs)
    if draft == "none":
        assert any(len(s) >= 2 for s in steps) and all(max(s) == 1 for s in steps)  # one-token rows, one pass
    if k is not None:  # a client's fixed k is never cut by the round's width: verifies of several rows
        assert any(len(s) >= 2 and max(s) > 1 for s in steps)


@cuda_floor
def test_cuda_flavor_seeded_batch_equals_alone(tiny_cuda_bundle):
    # a fixed k: an adaptive one is cut by the round's measured width, and a seed's numbers are then drawn
    # in another order (tests/engine/test_batch.py, the same for the one-pass path)
    reqs = [dict(prompt=p, max_new_tokens=16, temperature=0.9, top_p=0.95, seed=20 + i, draft=d, k=k)
            for i, (p, d, k) in enumerate(zip(PROMPTS, ["none", "ngram", "none", "ngram"], [None, 2, None, 3]))]
    _check(tiny_cuda_bundle, reqs)


def test_a_cpu_graph_on_an_onnxruntime_without_query_seqlens_batches_per_row(tiny_bundle, monkeypatch, caplog):
    monkeypatch.setattr(ortcompat, "gqa_schema_inputs", lambda: OLD_SCHEMA)
    reqs = [dict(prompt=p, max_new_tokens=18, draft="ngram") for p in PROMPTS[:3]]
    with caplog.at_level("INFO"):
        _check(tiny_bundle, reqs)
    line = next(m for m in caplog.messages if m.startswith("batched verify runs a pass per row"))
    assert "has no GroupQueryAttention query_seqlens: onnxruntime 1.32.0 or newer verifies the batch in one pass" in line
