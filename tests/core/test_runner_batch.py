"""ModelRunner's batched step: every row gets what that row's tokens would give alone."""
from __future__ import annotations

import numpy as np
import pytest

from edgespec.core.runner import CacheFull, ModelRunner, graph_batches
from edgespec.models.bundle import Bundle


def _session(path):
    """Through edgespec's providers: a bare InferenceSession clashes with the process-wide thread
    pool an engine opened by an earlier test may have set up."""
    from edgespec.edge.providers import create_session, shared_pool_active

    return create_session(path, providers=["cpu"], shared_threads=shared_pool_active())[0]


@pytest.fixture(scope="module")
def target(tiny_bundle):
    b = Bundle.open(tiny_bundle, verify=False)
    return b.target, _session(b.model_path("target"))


def _alone(facts, sess, prompt, steps, max_len):
    """Logits of each step of one sequence on the plain runner: [prompt] then each of `steps`."""
    r = ModelRunner(sess, facts, max_len).slot(0)
    out = [r.step(prompt, 1).copy()]
    for s in steps:
        out.append(r.step(s, len(s)).copy())
    return out


def test_exported_graphs_batch(target):
    from edgespec.models.ortcompat import missing_inputs

    # in one pass where this onnxruntime takes query_seqlens; an older one loads the graph without it
    assert graph_batches(target[1]) == (not missing_inputs())


def test_batched_rows_match_rows_alone(target):
    facts, sess = target
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, 400, n).tolist() for n in (5, 11, 3)]
    steps = [[[7, 8, 9], [4]], [[1], [2, 3, 4, 5]], [[6, 6], [9, 9, 9]]]
    br = ModelRunner(sess, facts, 32, 4)
    for b, p in enumerate(prompts):
        br.slot(b).step(p, 1)
    for i in range(2):
        got = br.step({b: steps[b][i] for b in range(3)})
        for b in range(3):
            ref = _alone(facts, sess, prompts[b], steps[b][: i + 1], 32)[-1]
            np.testing.assert_allclose(got[b], ref, atol=1e-4)
            assert br.lengths[b] == len(prompts[b]) + sum(len(s) for s in steps[b][: i + 1])
    assert br.lengths[3] == 0  # never used: untouched


def test_a_pass_over_high_slots_runs_only_their_block(target):
    """Slots 0 and 1 idle, 2 and 3 active: the pass runs rows [2, 4) (timed as a 2-row pass), and each
    row still gets what it gets alone; a later pass over 0 and 3 runs all four with 1 and 2 idle."""
    facts, sess = target
    prompts = {2: [5, 6, 7, 8], 3: [9, 10]}
    br = ModelRunner(sess, facts, 32, 4)
    for b, p in prompts.items():
        br.slot(b).step(p, 1)
    assert br.pass_range([2, 3]) == (2, 4)
    got = br.step({2: [11, 12], 3: [13]})
    for b, toks in ((2, [11, 12]), (3, [13])):
        np.testing.assert_allclose(got[b], _alone(facts, sess, prompts[b], [toks], 32)[-1], atol=1e-4)
    assert br.times.table(2).count.get(2) == 1 and br.times.table(4).count == {}
    assert br.lengths == [0, 0, 6, 3]
    br.slot(0).step([1, 2], 1)
    got = br.step({0: [3], 3: [14]})
    np.testing.assert_allclose(got[0], _alone(facts, sess, [1, 2], [[3]], 32)[-1], atol=1e-4)
    np.testing.assert_allclose(got[3], _alone(facts, sess, prompts[3], [[13], [14]], 32)[-1], atol=1e-4)
    assert br.lengths == [3, 0, 6, 4] and br.times.table(4).count.get(1) == 1


def test_rewind_one_slot_leaves_the_others(target):
    facts, sess = target
    br = ModelRunner(sess, facts, 32, 2)
    br.slot(0).step([1, 2, 3, 4], 1)
    br.slot(1).step([5, 6, 7], 1)
    br.step({0: [9, 9], 1: [8]})
    br.rewind(0, 4)  # forget slot 0's two rows, keep slot 1's
    got = br.step({0: [3], 1: [2]})
    np.testing.assert_allclose(got[0], _alone(facts, sess, [1, 2, 3, 4], [[3]], 32)[-1], atol=1e-4)
    np.testing.assert_allclose(got[1], _alone(facts, sess, [5, 6, 7], [[8], [2]], 32)[-1], atol=1e-4)
    with pytest.raises(ValueError, match="cannot rewind"):
        br.rewind(1, 99)


def test_a_row_at_the_cache_limit(target):
    """A slot filled to the last position while its neighbour pads: the mask is one wider than the cache."""
    facts, sess = target
    max_len = 12
    br = ModelRunner(sess, facts, max_len, 2)
    p0 = list(range(1, 11))  # 10 tokens: 2 positions left
    br.slot(0).step(p0, 1)
    br.slot(1).step([4, 5], 1)
    got = br.step({0: [3, 3], 1: [1, 2, 3]})  # slot 0 reaches exactly max_len, padded by one
    assert br.lengths == [12, 5]
    np.testing.assert_allclose(got[0], _alone(facts, sess, p0, [[3, 3]], max_len)[-1], atol=1e-4)
    np.testing.assert_allclose(got[1], _alone(facts, sess, [4, 5], [[1, 2, 3]], max_len)[-1], atol=1e-4)
    with pytest.raises(CacheFull):
        br.step({0: [1], 1: [1]})
    assert br.lengths == [12, 5]  # nothing written


def test_bad_rows_are_refused(target):
    facts, sess = target
    br = ModelRunner(sess, facts, 8, 2)
    with pytest.raises(ValueError, match="at least one row"):
        br.step({})
    with pytest.raises(ValueError, match="slot 5"):
        br.step({5: [1]})
    with pytest.raises(ValueError, match="no tokens"):
        br.step({0: []})
    with pytest.raises(ValueError, match="slots must be"):
        ModelRunner(sess, facts, 8, 0)


def test_an_old_graph_batches_a_pass_per_row(tiny_bundle, tmp_path):
    """A graph without the padded-queries edit (exported before batching) still serves several slots:
    one-token steps in one pass, longer ones a pass per row, each row what it gets alone."""
    import shutil

    import onnx

    b = Bundle.open(tiny_bundle, verify=False)
    src = b.model_path("target")
    m = onnx.load(str(src), load_external_data=False)
    del m.metadata_props[:]
    shutil.copy(src.parent / "model.onnx.data", tmp_path / "model.onnx.data")
    onnx.save(m, str(tmp_path / "model.onnx"))
    sess = _session(tmp_path / "model.onnx")
    br = ModelRunner(sess, b.target, 16, 2)
    assert not br.one_pass
    br.slot(0).step([1, 2, 3], 1)
    br.slot(1).step([4, 5], 1)
    got = br.step({0: [6, 7], 1: [8]})
    np.testing.assert_array_equal(got[0], _alone(b.target, sess, [1, 2, 3], [[6, 7]], 16)[-1])
    np.testing.assert_array_equal(got[1], _alone(b.target, sess, [4, 5], [[8]], 16)[-1])
    assert br.lengths == [5, 3]
    one = ModelRunner(sess, b.target, 8, 1)
    assert one.one_pass and one.step({0: [1, 2]})[0].shape == (2, b.target.vocab_size)