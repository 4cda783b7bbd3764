"""Tree verification: the pure tree functions, exact multi-candidate rejection sampling (chi-square,
with a negative control), cache compaction (every row against a fresh prefill, target and draft),
greedy losslessness for many tree shapes and at the cache limit, and format-1 (contract v1) bundles
running chain-only."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edgespec.core import tree as treelib
from edgespec.engine import Engine
from edgespec.errors import InvalidRequest
from edgespec.models.manifest import content_digest, file_entry
from edgespec.core.slot import Slot
from edgespec.engine.build import load_runner
from edgespec.core.sampling import SamplingParams
from edgespec.drafters.ngram import ngram_alternatives, ngram_match
from edgespec.engine.tree_round import _cap_width, subtree

from helpers.costs import freeze
from helpers.stats import chi2_gof


# --- pure functions ---------------------------------------------------------------------------------
def test_from_paths_merges_shared_prefixes_in_candidate_order():
    t = treelib.from_paths(9, [([1, 2, 3], None, "model"), ([1, 4], None, "model-alt"), ([5], None, "ngram")])
    assert t.tokens == [9, 1, 2, 3, 4, 5]
    assert t.parent == [-1, 0, 1, 2, 1, 0] and t.depth == [0, 1, 2, 3, 2, 1]
    assert t.children(0) == [1, 5] and t.children(1) == [2, 4]
    assert t.shape() == "2-2-1" and t.width() == 2 and not t.is_chain()
    anc = t.ancestors()
    assert anc[3].tolist() == [True, True, True, True, False, False]
    assert anc[4].tolist() == [True, True, False, False, True, False]
    assert (anc == np.tril(anc)).all()  # a parent precedes its children
    assert treelib.from_paths(9, [([1, 2], None, "model")]).is_chain()


def test_from_paths_respects_max_nodes_and_only_the_first_path_may_be_sampled():
    t = treelib.from_paths(0, [([1, 2, 3], None, "m"), ([4, 5], None, "n")], max_nodes=5)
    assert t.tokens == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="only the first candidate path"):
        treelib.from_paths(0, [([1], None, "m"), ([2], [np.ones(3)], "m")])


@pytest.mark.parametrize("parent,depth,match", [
    ([0, 0], [0, 1], "root"), ([-1, 1], [0, 1], "precede"), ([-1, 0], [0, 2], "depth")])
def test_malformed_trees_are_refused(parent, depth, match):
    with pytest.raises(ValueError, match=match):
        treelib.Tree([1, 2], parent, depth)


def test_subtree_and_width_cap_keep_order_and_parents():
    t = treelib.from_paths(0, [([1, 2], None, "m"), ([3], None, "a"), ([4, 5], None, "a"), ([6], None, "a")])
    capped = _cap_width(t, 2)
    assert capped.tokens == [0, 1, 2, 3] and capped.parent == [-1, 0, 1, 0]
    s = subtree(t, {0, 1, 4, 5})
    assert s.tokens == [0, 1, 4, 5] and s.parent == [-1, 0, 0, 2]


def test_ngram_alternatives_are_distinct_continuations_longest_match_first():
    ctx = [1, 2, 3, 1, 2, 4, 9, 1, 2]
    alts = ngram_alternatives(ctx, 2, 4)
    assert alts[0] == [4, 9] and [3, 1] in alts and len(alts) == len({tuple(a) for a in alts})
    assert ngram_alternatives([1], 3, 4) == [] and ngram_alternatives(ctx, 2, 0) == []


def _hits_by_scan(a, n):
    """Starts i of the earlier n-token windows a[i:i+n] equal to a's last n tokens: the window scan
    (one comparison of every window per match length) that ngram.suffix_matches replaced. The reference."""
    from numpy.lib.stride_tricks import sliding_window_view

    return np.flatnonzero((sliding_window_view(a[: len(a) - 1], n) == a[len(a) - n :]).all(axis=1))


def _ngram_alternatives_by_scan(ctx, k, width, max_n=5):
    a = np.asarray(ctx, dtype=np.int64)
    out, seen = [], set()
    if k <= 0 or width <= 0 or len(a) < 2:
        return out
    for n in range(min(max_n, len(a) - 1), 0, -1):
        for i in _hits_by_scan(a, n)[::-1]:
            cont = tuple(a[i + n : i + n + k].tolist())
            if cont and cont not in seen:
                seen.add(cont)
                out.append(list(cont))
                if len(out) >= width:
                    return out
    return out


def _ngram_match_by_scan(ctx, k, max_n=5, min_n=1):
    a = np.asarray(ctx, dtype=np.int64)
    if k <= 0 or len(a) < 2:
        return [], 0, -1
    for n in range(min(max_n, len(a) - 1), min_n - 1, -1):
        hits = _hits_by_scan(a, n)
        if hits.size:
            full = hits[hits + n + k <= len(a)]
            i = int(full[-1] if full.size else hits[-1])
            return a[i + n : i + n + k].tolist(), n, i + n
    return [], 0, -1


def test_ngram_lookups_match_the_scan_they_replaced():
    """The tree verifier's alternatives and the n-gram drafter's match (both on ngram.suffix_matches)
    give what one window scan per match length gave, in the same order, on random text over small
    vocabularies (many repeats, long matches) and on a few edge shapes."""
    rng = np.random.default_rng(7)
    cases = [[5, 5], [5, 5, 5, 5, 5, 5, 5], [1, 2, 1, 2, 1, 2, 1], [3, 1, 2, 3]]
    cases += [rng.integers(0, v, size=n).tolist() for v in (2, 3, 5, 20) for n in (3, 9, 40, 300)]
    checked = 0
    for ctx in cases:
        for k, width, max_n in ((1, 1, 5), (2, 4, 5), (4, 3, 3), (8, 8, 1), (3, 4, 12)):
            want = _ngram_alternatives_by_scan(ctx, k, width, max_n)
            assert ngram_alternatives(ctx, k, width, max_n) == want, (ctx, k, width, max_n)
            checked += bool(want)
            for min_n in (1, 2, 4):
                assert ngram_match(ctx, k, max_n, min_n) == _ngram_match_by_scan(ctx, k, max_n, min_n), \
                    (ctx, k, max_n, min_n)
    assert checked > 60  # most cases had continuations to compare


def test_greedy_acceptance_follows_the_argmax_down_the_tree():
    t = treelib.from_paths(0, [([1, 2], None, "m"), ([3, 4], None, "a")])  # nodes: 0, 1, 2, 3, 4
    rows = np.zeros((5, 6), dtype=np.float32)
    rows[0, 3] = rows[3, 4] = rows[4, 5] = 1.0  # target: 3 then 4 then 5
    assert treelib.accept_greedy(rows, t, 6) == ([0, 3, 4], 5)
    rows[0] = 0
    rows[0, 2] = 1.0  # a token no child holds: nothing accepted, the target's own token
    assert treelib.accept_greedy(rows, t, 6) == ([0], 2)


# --- sampling: exact distribution -------------------------------------------------------------------
V = 5


def _case(seed: int):
    rng = np.random.default_rng(seed)
    p_root = rng.dirichlet(np.ones(V) * 0.8)
    p2 = {t: rng.dirichlet(np.ones(V) * 0.8) for t in range(V)}  # the target after first token t
    q = rng.dirichlet(np.ones(V) * 0.8)  # the draft's distribution for the first token
    q_next = rng.dirichlet(np.ones(V))
    return p_root, p2, q, q_next


def _draw_pairs(seed: int, n: int, *, lie_about_q: bool = False) -> dict:
    """First two tokens of n rounds. Each round: the draft samples x ~ q (kept as the first child,
    with q, plus a sampled grandchild), its two runners-up (excluding x) and one n-gram-like
    alternative with a child of its own are deterministic siblings. When the path ends before two
    tokens are known, the second is drawn from the target after the first (as the next round would)."""
    p_root, p2, q, q_next = _case(seed)
    rng = np.random.default_rng(seed + 1)
    params = SamplingParams(temperature=1.0)
    counts: dict = {}
    for _ in range(n):
        x = int(rng.choice(V, p=q))
        y = int(rng.choice(V, p=q_next))
        ups = [int(t) for t in np.argsort(-q) if t != x][:2]
        paths = [([x, y], [q, q_next], "model")] + [([u], None, "model-alt") for u in ups]
        paths.append(([(x + 1) % V, 2], None, "ngram"))
        t = treelib.from_paths(0, paths)
        if lie_about_q:  # the bug: a deterministic runner-up scored as if it had been sampled from q
            t.q[t.children(0)[1]] = q
        rows = np.stack([np.log(p_root) if i == 0 else
                         (np.log(p2[t.tokens[i]]) if t.depth[i] == 1 else np.zeros(V)) for i in range(len(t))])
        path, nxt = treelib.accept_sampled(rows.astype(np.float64), t, params, rng, V)
        toks = t.path_tokens(path[1:]) + [nxt]
        if len(toks) < 2:
            toks.append(int(rng.choice(V, p=p2[toks[0]])))
        key = (toks[0], toks[1])
        counts[key] = counts.get(key, 0) + 1
    return counts


def _expected(seed: int) -> dict:
    p_root, p2, _q, _qn = _case(seed)
    return {(a, b): p_root[a] * p2[a][b] for a in range(V) for b in range(V)}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tree_rejection_sampling_keeps_the_target_distribution(seed):
    n = 12000
    assert chi2_gof(_draw_pairs(seed, n), _expected(seed), n) > 1e-3


def test_the_tree_chi_square_check_can_fail():
    """Negative control: a runner-up (picked, not sampled) accepted with min(1, r/q) as if it had
    been drawn from q biases the output. (Treating the sampled candidate as deterministic would
    NOT be a control: one-hot acceptance is exact for any candidate, it only accepts less.)"""
    n = 12000
    assert min(chi2_gof(_draw_pairs(s, n, lie_about_q=True), _expected(s), n) for s in (0, 1, 2)) < 1e-6


# --- the runner: tree step + compaction ---------------------------------------------------------------
def _runner(bundle, role: str, max_len: int = 64) -> Slot:
    from edgespec.models.bundle import Bundle

    b = Bundle.open(bundle, verify=False)
    facts = b.manifest.models[role]
    return load_runner(b.model_path(role), facts, max_len)


def _rows(r: Slot, n: int) -> list[np.ndarray]:
    return [a[0] for a in r.rows(0, n)[0]]


def test_tree_step_matches_chains_and_compaction_matches_a_fresh_prefill(tiny_bundle):
    rng = np.random.default_rng(3)
    prompt = rng.integers(3, 400, size=7).tolist()
    tr = _runner(tiny_bundle, "target")
    assert tr.can_tree
    tr.step(prompt[:-1], 1)
    L = tr.length
    paths = [([11, 12, 13], None, "m"), ([11, 14], None, "a"), ([15, 16, 17, 18], None, "a"), ([19], None, "a")]
    t = treelib.from_paths(prompt[-1], paths)
    rows = tr.step_tree(t.tokens, t.depth, t.ancestors()).copy()
    for i in range(len(t)):  # each node's logits == a chain run of its path
        ref = _runner(tiny_bundle, "target")
        path = [i]
        while t.parent[path[0]] >= 0:
            path.insert(0, t.parent[path[0]])
        want = ref.step(prompt[:-1] + t.path_tokens(path), 1)[0]
        np.testing.assert_allclose(rows[i], want, atol=1e-4, rtol=1e-4)
    keep = [0, 5, 6, 7, 8]  # the path 15-16-17-18: the furthest from contiguous
    assert t.path_tokens(keep) == [prompt[-1], 15, 16, 17, 18]
    tr.compact([L + i for i in keep[1:]], L + 1)
    tr.rewind(L + len(keep))
    fresh = _runner(tiny_bundle, "target")
    fresh.step(prompt + [15, 16, 17, 18], 1)
    for got, want in zip(_rows(tr, tr.length), _rows(fresh, fresh.length)):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
    # and decoding goes on from the compacted cache exactly as from the fresh one
    np.testing.assert_allclose(tr.step([20], 1), fresh.step([20], 1), atol=1e-4, rtol=1e-4)


def test_compact_refuses_a_path_that_is_not_one(tiny_bundle):
    r = _runner(tiny_bundle, "target", 16)
    r.step(list(range(3, 13)), 1)
    with pytest.raises(ValueError, match="not an ascending path"):
        r.compact([5, 4], 3)
    with pytest.raises(ValueError, match="not an ascending path"):
        r.compact([12], 3)
    r.compact([3, 4], 3)  # already in place: nothing to do


def _check_caches_match_fresh_prefill(eng: Engine, bundle) -> None:
    """Every row the target and draft caches hold equals a fresh prefill of the tokens they claim."""
    held = eng.cached()
    fresh = _runner(bundle, "target", eng.max_len)
    fresh.step(held, 1)
    for got, want in zip(_rows(eng.target, len(held)), _rows(fresh, len(held))):
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
    model = eng.slot_drafters(0)["model"]
    dt = list(model.tokens)
    assert dt == held[: len(dt)]  # the draft holds a prefix of the context
    if dt:
        fresh_d = _runner(bundle, "draft", eng.max_len)
        fresh_d.step(dt, 1)
        for got, want in zip(_rows(model.runner, len(dt)), _rows(fresh_d, len(dt))):
            np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def tree_engines(tiny_bundle, tiny_bundle_disagree, tiny_llama_bundle):
    return {name: (Engine.open(path, max_len=160, warmup=False), path) for name, path in
            (("agree", tiny_bundle), ("disagree", tiny_bundle_disagree), ("llama", tiny_llama_bundle))}


def test_caches_after_tree_rounds_equal_a_fresh_prefill(tree_engines):
    eng, path = tree_engines["agree"]
    eng.tree_verifier().width = 3
    prompt = "one two three one two four one two three one two"
    r = eng.generate(prompt, max_new_tokens=40, draft="auto", k=4, tree="on")
    assert r.stats.tree_rounds > 0
    _check_caches_match_fresh_prefill(eng, path)
    r = eng.generate(prompt, max_new_tokens=40, draft="model", k=5, tree="on")
    st = r.stats
    assert st.tree_rounds > 0 and sum(st.accepted_depth.values()) == st.tree_rounds
    assert st.tree_off_chain <= st.accepted  # tokens accepted off the chain are accepted tokens
    _check_caches_match_fresh_prefill(eng, path)


# --- greedy: lossless for many shapes ---------------------------------------------------------------
def _prompts(eng: Engine, seed: int, n: int) -> list[str]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        ids = rng.integers(3, eng.vocab.usable, size=int(rng.integers(3, 30))).tolist()
        ids = ids + ids[: int(rng.integers(0, len(ids)))]  # repeats: the n-gram drafter finds alternatives
        text = eng.tokenizer.decode(ids)
        out.append(text if text.strip() else "x" + text)
    return out


@pytest.mark.parametrize("name", ["agree", "disagree", "llama"])
def test_greedy_tree_output_is_target_alone_output_for_widths_and_depths(tree_engines, name):
    eng, _ = tree_engines[name]
    bad, trees = [], 0
    shapes = set()
    for i, prompt in enumerate(_prompts(eng, 7 + len(name), 3)):
        ref = eng.generate(prompt, max_new_tokens=32, draft="none")
        for width in (1, 2, 3, 4):
            eng.tree_verifier().width = width
            for depth in (1, 2, 4, 6):
                for draft in ("model", "auto", "ngram"):
                    r = eng.generate(prompt, max_new_tokens=32, draft=draft, k=depth, tree="on")
                    trees += r.stats.tree_rounds
                    shapes.update(r.stats.tree_shapes)
                    if (r.token_ids, r.text, r.finish_reason) != (ref.token_ids, ref.text, ref.finish_reason):
                        bad.append((i, width, depth, draft))
    eng.tree_verifier().width = 4
    assert not bad, bad[:5]
    assert trees > 50 and len(shapes) > 10  # trees really ran, in many shapes


def test_greedy_tree_widens_a_suffix_chain_with_the_index_alternatives(tree_engines):
    """draft=suffix, tree=on: the chain is widened with the index's other continuations of the
    longest match (SuffixIndex.alternatives); the output stays the target's."""
    eng, _ = tree_engines["agree"]
    sources: list[str] = []
    widen = eng.tree_verifier()._widen

    def spy(*a, **kw):
        tree = widen(*a, **kw)
        sources.extend(tree.source)
        return tree

    eng.tree_verifier()._widen = spy
    bad = []
    try:
        prompts = ["one two three one two four one two five one two three one two", *_prompts(eng, 21, 2)]
        for i, prompt in enumerate(prompts):
            ref = eng.generate(prompt, max_new_tokens=32, draft="none")
            for width in (2, 4):
                eng.tree_verifier().width = width
                for depth in (2, 6):
                    r = eng.generate(prompt, max_new_tokens=32, draft="suffix", k=depth, tree="on")
                    if r.token_ids != ref.token_ids:
                        bad.append((i, width, depth))
    finally:
        del eng.tree_verifier()._widen
        eng.tree_verifier().width = 4
    assert not bad, bad[:5]
    assert sources.count("suffix-alt") > 10 and sources.count("suffix") > 10


@pytest.mark.parametrize("name", ["agree", "llama"])
def test_greedy_tree_is_lossless_at_the_cache_limit(tree_engines, name):
    eng, _ = tree_engines[name]
    rng = np.random.default_rng(11)
    ids = rng.integers(3, eng.vocab.usable, size=22).tolist()
    prompt = eng.tokenizer.decode(ids * 3)
    n = eng.count_tokens(prompt)
    assert n < eng.max_len - 20
    ref = eng.generate(prompt, max_new_tokens=400, draft="none")
    assert ref.finish_reason in ("cache_full", "stop")
    for width in (2, 4):
        eng.tree_verifier().width = width
        for depth in (3, 6):
            r = eng.generate(prompt, max_new_tokens=400, draft="auto", k=depth, tree="on")
            assert (r.token_ids, r.finish_reason) == (ref.token_ids, ref.finish_reason), (width, depth)
    eng.tree_verifier().width = 4


def test_auto_tree_is_lossless_and_records_its_choice(tree_engines):
    eng, _ = tree_engines["agree"]
    for prompt in _prompts(eng, 5, 3):
        ref = eng.generate(prompt, max_new_tokens=32, draft="none")
        r = eng.generate(prompt, max_new_tokens=32, draft="auto", tree="auto")
        assert r.token_ids == ref.token_ids and r.stats.tree == "auto"
        off = eng.generate(prompt, max_new_tokens=32, draft="auto", tree="off")
        assert off.token_ids == ref.token_ids and off.stats.tree_rounds == 0


def test_sampled_tree_output_is_reproducible_and_uses_the_tree(tree_engines):
    eng, _ = tree_engines["agree"]
    prompt = "one two three one two four one two three one two"
    a = eng.generate(prompt, max_new_tokens=30, draft="model", k=4, tree="on", temperature=0.8, seed=5)
    b = eng.generate(prompt, max_new_tokens=30, draft="model", k=4, tree="on", temperature=0.8, seed=5)
    assert a.token_ids == b.token_ids and a.stats.tree_rounds > 0


def test_unknown_tree_mode_is_named(tree_engines):
    eng, _ = tree_engines["agree"]
    with pytest.raises(InvalidRequest, match="unknown tree mode 'wide'") as e:
        eng.generate("hi", tree="wide")
    assert e.value.param == "tree"


# --- format 1 (graph contract v1) bundles: chain-only -------------------------------------------------
def downgrade_to_v1(bundle: Path) -> None:
    """Rewrites a bundle as the previous edgespec exported it: graphs without position_ids and
    attention_bias, manifest format_version 1 without those facts (re-signed)."""
    import onnx

    m = json.loads((bundle / "manifest.json").read_text())
    for facts in m["models"].values():
        path = bundle / facts["path"]
        model = onnx.load(str(path), load_external_data=False)
        g = model.graph
        for n in g.node:
            if n.op_type == "GroupQueryAttention":
                n.input[9] = n.input[10] = ""
        keep = [i for i in g.input if i.name not in ("position_ids", "attention_bias")]
        del g.input[:]
        g.input.extend(keep)
        onnx.save(model, str(path))
        m["files"][facts["path"]] = file_entry(path)
        facts.pop("position_ids")
        facts.pop("attention_bias")
    m["format_version"] = 1
    m["digest"] = content_digest(m)
    (bundle / "manifest.json").write_text(json.dumps(m, indent=2))


def test_a_format_1_bundle_runs_chain_only_and_refuses_tree_on(tiny_bundle, bundle_copy):
    from helpers.cli import verify

    b = bundle_copy(tiny_bundle, "v1")
    downgrade_to_v1(b)
    rc, lines = verify(b, "--load")
    assert rc == 0 and "chain-only" in lines[-1] and "re-export" in lines[-1]
    eng = Engine.open(b, max_len=128, warmup=False)
    try:
        assert not eng.target.supports_tree and eng.bundle.target.position_ids is None
        prompt = "one two three one two four one two three one two"
        ref = eng.generate(prompt, max_new_tokens=30, draft="none")
        r = eng.generate(prompt, max_new_tokens=30, draft="auto", k=4)  # tree="auto": chains
        assert r.token_ids == ref.token_ids and r.stats.tree_rounds == 0 and r.stats.drafted > 0
        with pytest.raises(InvalidRequest, match="contract v1.*re-export") as e:
            eng.generate(prompt, tree="on")
        assert e.value.param == "tree"
    finally:
        eng.close()
    with pytest.raises(InvalidRequest, match="re-export"):
        Engine.open(b, max_len=64, warmup=False, tree="on")


def test_a_current_cpu_export_is_format_3_with_the_tree_inputs(tiny_bundle):
    import onnx

    m = json.loads((tiny_bundle / "manifest.json").read_text())
    assert m["format_version"] == 3  # contract v3: the cpu flavor keeps both tree inputs
    for facts in m["models"].values():
        assert facts["position_ids"] == "position_ids" and facts["attention_bias"] == "attention_bias"
        g = onnx.load(str(tiny_bundle / facts["path"]), load_external_data=False).graph
        inputs = {i.name: i for i in g.input}
        assert inputs["position_ids"].type.tensor_type.elem_type == onnx.TensorProto.INT64
        assert inputs["attention_bias"].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
        assert len(inputs["attention_bias"].type.tensor_type.shape.dim) == 4
        for n in g.node:
            if n.op_type == "GroupQueryAttention":
                assert n.input[9] == "position_ids" and n.input[10] == "attention_bias"


# --- the auto decision ----------------------------------------------------------------------------
def _verifier(cost_of_size):
    from edgespec.core.costmodel import CostModel
    from edgespec.core.runner import StepTimes
    from edgespec.engine.tree_round import TreeVerifier

    times = StepTimes()
    for s in range(1, 17):
        for _ in range(3):
            times.add(s, cost_of_size(s))
    costs = CostModel(times)
    return TreeVerifier(costs, None)  # the pricing alone: no target


def _ngram_tree():
    from edgespec.drafters import Proposal

    prop = Proposal([5, 6, 7], None, "ngram", ngram=3, accept=[0.45, 0.75, 0.75])  # ngram's priors
    paths = [([5, 6, 7], None, "ngram"), ([8, 9, 10], None, "ngram"), ([11, 12], None, "ngram")]
    return prop, treelib.from_paths(1, paths)


def test_auto_keeps_the_chain_where_verify_is_steep_and_widens_where_it_is_flat():
    prop, tree = _ngram_tree()
    steep = _verifier(lambda s: 0.05 * (1 + 0.45 * (s - 1)))  # a 2-core CPU: verify(5) ~ 2.8x verify(1)
    assert steep._prune(tree, prop, prop.tokens).tokens == [1, 5, 6, 7]  # the chain, nothing added
    flat = _verifier(lambda s: 0.05)  # a GPU: verify nearly free per extra row
    wide = flat._prune(tree, prop, prop.tokens)
    assert wide.tokens[:4] == [1, 5, 6, 7] and len(wide) > 4 and not wide.is_chain()


def test_reach_estimates_multiply_down_the_tree():
    prop, tree = _ngram_tree()
    v = _verifier(lambda s: 0.05)
    p = v.reach(tree, prop, prop.tokens)
    assert p[0] == 1.0 and all(0.0 <= x <= 1.0 for x in p)
    for i in range(1, len(tree)):
        assert p[i] <= p[tree.parent[i]]  # a node is never likelier than its parent


def test_past_the_measured_sizes_a_tree_costs_at_least_linear_per_token():
    """Noisy points (9 tokens timed no dearer than 7) must not make a 15-node tree look cheap."""
    noisy = {1: 0.050, 2: 0.055, 3: 0.070, 4: 0.080, 5: 0.13, 6: 0.18, 7: 0.163, 8: 0.235, 9: 0.165}
    v = _verifier(lambda s: noisy.get(s, 0.0) or 0.05 * s)
    v.costs.target = type(v.costs.target)()
    for s, t in noisy.items():
        for _ in range(3):
            v.costs.target.add(s, t)
    assert max(v.costs.measured()) == 9
    assert v.verify_cost(15) >= 0.165 * 15 / 9 - 1e-12
    assert v.verify_cost(5) == pytest.approx(v.costs.verify(5))  # inside the measured sizes: as measured


def test_verify_names_a_format_2_manifest_whose_graph_lacks_the_tree_inputs(tiny_bundle, bundle_copy):
    """A manifest claiming contract v2 over a v1 graph is caught by `verify`, naming the fix."""
    from edgespec.models.graphcheck import bundle_problems
    from edgespec.models.bundlecheck import verify_bundle

    b = bundle_copy(tiny_bundle, "v2-claim")
    downgrade_to_v1(b)
    m = json.loads((b / "manifest.json").read_text())
    m["format_version"] = 2
    for facts in m["models"].values():
        facts["position_ids"], facts["attention_bias"] = "position_ids", "attention_bias"
    m["digest"] = content_digest(m)
    (b / "manifest.json").write_text(json.dumps(m, indent=2))
    manifest, problems = verify_bundle(b)  # the graph facts say it, before any dtype check
    assert problems == [f"{r}/model.onnx: manifest models.{r}.{name} names input '{name}', which the graph does "
                        "not have (a graph of an older contract: re-export the bundle)"
                        for r in ("target", "draft") for name in ("position_ids", "attention_bias")]
    lines = bundle_problems(b, manifest)
    assert any("has no input 'position_ids' (graph contract v2): re-export" in x for x in lines), lines
    assert bundle_problems(tiny_bundle, verify_bundle(tiny_bundle)[0]) == []


def _random_round(rng, v):
    """A random chain (suffix, n-gram or model source, random per-token acceptance), random learned
    alternative means and a random widening of it, capped as _widen caps it."""
    from edgespec.drafters import Beta, Proposal

    for name in v.alt:
        v.alt[name] = Beta(rng.uniform(0.01, 0.99))
    v.cont = rng.uniform(0.05, 0.98)
    source = str(rng.choice(["suffix", "ngram", "model", "none"]))
    n = 0 if source == "none" else int(rng.integers(1, 8))
    draft = [int(t) for t in rng.integers(10, 40, n)]
    prop = Proposal(draft, None, source, ngram=int(rng.integers(1, 5)),
                    accept=[float(a) for a in rng.uniform(0.05, 1.0, n)])
    paths = [(draft, None, source)]
    for _ in range(int(rng.integers(0, 10))):
        cut = int(rng.integers(0, n + 1))
        tail = [int(t) for t in rng.integers(10, 40, int(rng.integers(1, 6)))]
        paths.append((draft[:cut] + tail, None, str(rng.choice(["model-alt", "suffix-alt", "ngram"]))))
    max_nodes = int(rng.integers(1, 33))
    tree = _cap_width(treelib.from_paths(1, paths, max_nodes=max_nodes), 4)
    return prop, draft, tree, max_nodes


@pytest.mark.parametrize("flat", [False, True], ids=["steep-cpu", "flat-gpu"])
def test_a_round_skips_widening_only_where_pruning_would_keep_no_branch(flat):
    """The widening is skipped (TreeVerifier._no_tree_can_pay) only where _prune of any widening
    would return a tree without a branch (which `round` verifies as the drafter's chain): checked on
    3,000 random chains, alternatives, learned means and cost curves, and a bound that under-prices
    the rows past the chain (the negative control) is caught by the same check."""
    rng = np.random.default_rng(7 if flat else 8)
    skipped = wrong = wrong_control = 0
    for _ in range(1500):
        per_row = rng.uniform(0.0, 0.02) if flat else rng.uniform(0.12, 0.5)
        v = _verifier(lambda s, r=per_row: 0.05 * (1 + r * (s - 1)))
        prop, draft, tree, max_nodes = _random_round(rng, v)
        chain_kept = v._prune(tree, prop, draft).is_chain()
        if v._no_tree_can_pay(prop, draft, max_nodes):
            skipped += 1
            wrong += not chain_kept
        dear = v._row_costs().copy()  # the control: rows past the chain priced 60 % dearer, in the bound only
        dear[len(draft) + 2:] *= 1.6
        v._row_costs = lambda rows=dear: rows
        if v._no_tree_can_pay(prop, draft, max_nodes) and not chain_kept:
            wrong_control += 1
    assert wrong == 0
    assert wrong_control > 0
    # the bound does fire on random rounds, at any learned means: 653 of 1,500 steep, 206 flat (round
    # twelve's bound, which took a kept path for a tree, skipped 250 and 200 of the same rounds)
    assert skipped > (180 if flat else 550)


def test_the_widening_is_skipped_on_a_steep_cpu_verify_and_kept_on_a_flat_one():
    """A suffix chain of 3 tokens at the priors' means (alternatives 0.15, copies continuing 0.75):
    on a verify 17 % dearer per row (the dev CPU) no tree can pay, on a flat one (a GPU) one can."""
    from edgespec.drafters import Proposal

    prop = Proposal([5, 6, 7], None, "suffix", accept=[0.9, 0.8, 0.7])
    steep = _verifier(lambda s: 0.0334 * (1 + 0.17 * (s - 1)))
    flat = _verifier(lambda s: 0.05)
    assert steep._no_tree_can_pay(prop, prop.tokens, 32) is True
    assert flat._no_tree_can_pay(prop, prop.tokens, 32) is False
    assert steep._no_tree_can_pay(prop, prop.tokens, 4) is True  # no row left past the chain


def test_a_plain_round_skips_the_widening_where_only_a_path_could_pay():
    """Nothing proposed, at the priors' means: one copy under the root prices as paying on the dev
    CPU's curve (1.75 tokens for a 2-row verify at 1.17x), but only as a path, which `round` drops for
    the drafter's empty chain, and a branch under it (0.25 x 0.15 = 0.04) never pays there: the bound
    skips. On a flat verify a branching tree pays, and the widening runs."""
    from edgespec.drafters import Proposal

    plain = Proposal([], None, "none")
    steep = _verifier(lambda s: 0.0334 * (1 + 0.17 * (s - 1)))
    flat = _verifier(lambda s: 0.05)
    assert steep._no_tree_can_pay(plain, [], 32) is True
    assert flat._no_tree_can_pay(plain, [], 32) is False
    # the same widening pruned: a path kept on the steep curve (no branch), a branching tree on the flat one
    paths = [([], None, "none"), ([11, 12, 13], None, "suffix-alt"), ([14, 15], None, "ngram"),
             ([11, 16], None, "ngram")]
    tree = _cap_width(treelib.from_paths(1, paths, max_nodes=32), 4)
    kept = steep._prune(tree, plain, [])
    assert len(kept) > 1 and kept.is_chain()
    assert flat._prune(tree, plain, []).width() == 2


def test_a_skipped_widening_runs_the_same_round_as_a_pruned_one(tree_engines):
    """End to end, greedy `auto` with tree='auto' at pinned CPU-like step costs (each row 17 % more):
    the same tokens and the same rounds whether the bound skips the widening or every round widens
    and prunes (the bound turned off), and the bound did skip rounds."""
    from edgespec.engine import tree_round

    _, path = tree_engines["agree"]
    orig = tree_round.TreeVerifier._no_tree_can_pay
    said = []  # the bound's answers in the run that uses it

    def recorded(self, *a):
        said.append(orig(self, *a))
        return said[-1]

    runs = []
    for skip in (True, False):
        tree_round.TreeVerifier._no_tree_can_pay = recorded if skip else (lambda self, *a: False)
        eng = Engine.open(path, max_len=160, warmup=False)  # each run from a fresh engine's state
        freeze(eng.target.times, **{f"s{n}": 0.0334 * (1 + 0.17 * (n - 1)) for n in range(1, 17)})
        freeze(eng.draft_runner.times, **{f"s{n}": 0.0133 + 0.002 * (n - 1) for n in range(1, 17)})
        prompts = _prompts(eng, 3, 4)
        try:
            runs.append([(r.token_ids, r.stats.rounds, dict(r.stats.rounds_by_source), r.stats.tree_rounds)
                         for r in (eng.generate(p, max_new_tokens=24, draft="auto", tree="auto") for p in prompts)])
        finally:
            tree_round.TreeVerifier._no_tree_can_pay = orig
    assert runs[0] == runs[1]
    assert sum(said) > 0
