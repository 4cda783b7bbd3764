"""Sampling parameters, the warped distribution, and the lossless property of speculative sampling
on pure-numpy fake models (thousands of draws, fixed seeds, chi-square against exact probabilities).
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from edgespec.drafters import ModelDrafter, NgramDrafter, Proposal
from edgespec.errors import InvalidRequest
from edgespec.core.runner import StepTimes
from edgespec.core.sampling import SamplingParams, choose, probs, sample
from helpers.rounds import speculative_round
from edgespec.drafters import RecycleDrafter, SuffixDrafter, SuffixIndex

from helpers.stats import chi2_gof, chi2_sf


# --- statistics helper (no scipy needed) ---------------------------------------------------------
def test_chi2_sf_matches_known_values():
    assert chi2_sf(3.841, 1) == pytest.approx(0.05, abs=1e-3)
    assert chi2_sf(18.307, 10) == pytest.approx(0.05, abs=1e-3)
    assert chi2_sf(124.342, 100) == pytest.approx(0.05, abs=1e-3)
    assert chi2_sf(0.0, 3) == 1.0


# --- parameters ----------------------------------------------------------------------------------
@pytest.mark.parametrize("kw,param", [
    (dict(temperature=-0.1), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.01), "top_p"),
    (dict(top_p=-1), "top_p"),
    (dict(top_k=-1), "top_k"),
    (dict(top_k=2.5), "top_k"),
    (dict(seed="x"), "seed"),
])
def test_bad_sampling_params_are_refused_with_their_name(kw, param):
    with pytest.raises(InvalidRequest) as e:
        SamplingParams(**kw)
    assert e.value.param == param
    assert param in str(e.value)


def test_greedy_flags():
    assert SamplingParams().greedy
    assert SamplingParams(temperature=0.8, top_k=1).greedy
    assert not SamplingParams(temperature=0.8).greedy


def _reference_probs(row, t, top_k, top_p, usable):
    """Straightforward full-sort implementation to check the fast one against."""
    x = np.asarray(row[:usable], dtype=np.float64) / t
    order = np.lexsort((np.arange(usable), -x))
    keep = order[:top_k] if top_k else order
    e = np.exp(x[keep] - x[keep].max())
    p = e / e.sum()
    if top_p < 1:
        c = np.cumsum(p)
        cut = int(np.searchsorted(c, top_p - 1e-12)) + 1
        keep, p = keep[:cut], p[:cut] / p[:cut].sum()
    out = np.zeros(usable)
    out[keep] = p
    return out


@pytest.mark.parametrize("t,top_k,top_p", [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 5, 1.0), (1.0, 0, 0.9),
                                           (0.5, 50, 0.8), (2.0, 0, 0.3), (1.0, 0, 0.999)])
def test_probs_match_a_plain_reference(t, top_k, top_p):
    rng = np.random.default_rng(0)
    for V in (40, 3000):
        row = rng.normal(size=V + 7).astype(np.float32) * 3
        row[V:] = 100.0  # padding rows: huge logits that must be ignored
        got = probs(row, SamplingParams(temperature=t, top_k=top_k, top_p=top_p), V)
        ref = _reference_probs(row, t, top_k, top_p, V)
        assert got.shape == (V,)
        np.testing.assert_allclose(got, ref, atol=1e-12)
        assert got.sum() == pytest.approx(1.0)


def test_padding_rows_are_never_chosen():
    rng = np.random.default_rng(1)
    row = rng.normal(size=60).astype(np.float32)
    row[50:] = 1e4
    for params in (SamplingParams(), SamplingParams(temperature=1.0), SamplingParams(temperature=5.0, top_p=0.5)):
        for _ in range(200):
            assert choose(row, params, 50, rng) < 50


def test_sample_follows_p():
    rng = np.random.default_rng(2)
    p = np.array([0.1, 0.0, 0.6, 0.3])
    n = 20000
    counts = np.bincount([sample(p, rng) for _ in range(n)], minlength=4)
    assert counts[1] == 0
    assert chi2_gof({i: counts[i] for i in range(4)}, {0: 0.1, 2: 0.6, 3: 0.3}, n) > 1e-3


# --- speculative sampling on fake models ---------------------------------------------------------
class FakeRunner:
    """One sequence's runner interface (core/slot.Slot) over a pure function of the context: logits = table[ctx[-2:]].

    Two padding rows past `usable` carry huge logits: choosing one would show at once."""

    def __init__(self, table: np.ndarray, max_len: int = 64):
        self.table = table  # [V, V, V+2]: logits after (second-last, last)
        self.vocab_size = table.shape[-1]
        self.max_len = max_len
        self.tokens: list[int] = []
        self.times = StepTimes()

    @property
    def length(self) -> int:
        return len(self.tokens)

    @property
    def free(self) -> int:
        return self.max_len - self.length

    def logits_after(self, ctx) -> np.ndarray:
        a = ctx[-2] if len(ctx) >= 2 else 0
        return self.table[a, ctx[-1]]

    def step(self, tokens, n_logits=1):
        assert self.length + len(tokens) <= self.max_len
        self.tokens.extend(int(t) for t in tokens)
        self.times.add(len(tokens), 0.01 * (1 + 0.2 * (len(tokens) - 1)))
        n = len(self.tokens)
        return np.stack([self.logits_after(self.tokens[: n - n_logits + 1 + i]) for i in range(n_logits)])

    def rewind(self, length):
        assert 0 <= length <= self.length
        del self.tokens[length:]

    def reset(self):
        self.tokens.clear()


V = 5


def _tables(agree: bool, seed: int = 0):
    rng = np.random.default_rng(seed)
    t = rng.normal(size=(V, V, V + 2)) * 1.5
    t[..., V:] = 50.0
    if agree:
        d = t + rng.normal(size=t.shape) * 0.3
    else:
        d = rng.normal(size=t.shape) * 1.5
        d[..., V:] = 50.0
    return t, d


def _exact_joint(table, prompt, params, n_tokens):
    """Exact probability of every continuation of n_tokens under target-alone sampling."""
    runner = FakeRunner(table)
    out = {}
    for seq in itertools.product(range(V), repeat=n_tokens):
        ctx = list(prompt)
        p = 1.0
        for t in seq:
            p *= probs(runner.logits_after(ctx), params, V)[t]
            if p == 0:
                break
            ctx.append(t)
        if p > 0:
            out[seq] = p
    return out


def _spec_draws(t_table, d_table, params, drafter_kind, k, n_draws, n_tokens=3, seed=0, vocab_map=None):
    """Runs the real speculative_round with fake runners n_draws times; counts the token sequences
    after the first (which the prefill samples from the target directly)."""
    prompt = [1, 3]
    counts: dict = {}
    rng = np.random.default_rng(seed)
    target = FakeRunner(t_table)
    draft_runner = FakeRunner(d_table)
    index = SuffixIndex(capacity=4096)
    recycle = RecycleDrafter(V, adaptive=False)
    for _ in range(n_draws):
        target.reset()
        row = target.step(prompt, 1)[0]
        ctx = prompt + [choose(row, params, V, rng)]
        if drafter_kind == "model":
            drafter = ModelDrafter(draft_runner, V, adaptive=False, vocab_map=vocab_map)
            drafter.begin(ctx)
        elif drafter_kind == "ngram-fixed":
            drafter = _FixedProposer([ctx[-1]] * k)  # deterministic proposals: q one-hot
        elif drafter_kind == "suffix":
            drafter = SuffixDrafter(index, adaptive=False)  # one index across draws: it learns
            drafter.begin(ctx)
        elif drafter_kind == "recycle":
            drafter = recycle  # one table across draws, filled from the verify rows
            drafter.begin(ctx)
        else:
            drafter = NgramDrafter(adaptive=False)
        while len(ctx) < len(prompt) + n_tokens:
            r = speculative_round(target, drafter, ctx, k, params, rng, V)
            ctx.extend(r.tokens)
            assert target.length == len(ctx) - 1
        seq = tuple(ctx[len(prompt) : len(prompt) + n_tokens])
        counts[seq] = counts.get(seq, 0) + 1
    return counts


class _FixedProposer:
    name = "fixed"

    def __init__(self, tokens):
        self.tokens = tokens

    def begin(self, ctx):
        pass

    def propose(self, ctx, k, params, rng):
        return Proposal(list(self.tokens[:k]), None, "ngram")

    def feedback(self, proposal, accepted, valid_len):
        pass


SAMPLING = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=4, top_p=0.9)]


@pytest.mark.arm64
@pytest.mark.parametrize("agree", [True, False], ids=["draft-agrees", "draft-disagrees"])
@pytest.mark.parametrize("pi", [0, 1], ids=["t1", "t0.7-k4-p0.9"])
def test_speculative_sampling_matches_target_distribution(agree, pi):
    params = SAMPLING[pi]
    t, d = _tables(agree)
    n = 4000
    counts = _spec_draws(t, d, params, "model", k=3, n_draws=n, seed=10 + pi)
    exact = _exact_joint(t, [1, 3], params, 3)
    assert all(all(x < V for x in seq) for seq in counts)
    assert chi2_gof(counts, exact, n) > 1e-3


@pytest.mark.parametrize("kind", ["ngram-fixed", "ngram", "suffix", "recycle"])
def test_deterministic_proposals_use_one_hot_q(kind):
    params = SAMPLING[0]
    t, _ = _tables(True)
    n = 4000
    counts = _spec_draws(t, t, params, kind, k=2, n_draws=n, seed=3)
    assert chi2_gof(counts, _exact_joint(t, [1, 3], params, 3), n) > 1e-3


def test_the_chi_square_check_can_fail():
    """The same harness catches a broken acceptance rule (accepting every draft token): the tests
    above are not vacuous."""
    import edgespec.core.speculative as spec

    params = SAMPLING[0]
    t, d = _tables(False)
    orig = spec.accept

    def accept_all(rows, prop, draft, params, rng, usable, constraint=None, cut_q=None):
        return len(draft), sample(probs(rows[len(draft)], params, usable), rng)

    spec.accept = accept_all
    try:
        counts = _spec_draws(t, d, params, "model", k=3, n_draws=2000, seed=5)
    finally:
        spec.accept = orig
    assert chi2_gof(counts, _exact_joint(t, [1, 3], params, 3), 2000) < 1e-6


def test_greedy_params_make_rejection_sampling_greedy():
    """With greedy params probs() is one-hot, so every path agrees with argmax decoding."""
    t, d = _tables(False)
    params = SamplingParams()
    rng = np.random.default_rng(0)
    target = FakeRunner(t)
    row = target.step([1, 3], 1)[0]
    ctx = [1, 3, choose(row, params, V, rng)]
    drafter = ModelDrafter(FakeRunner(d), V, adaptive=False)
    while len(ctx) < 20:
        ctx.extend(speculative_round(target, drafter, ctx, 4, params, rng, V).tokens)
    ref = [1, 3]
    for _ in range(len(ctx) - 2):
        ref.append(int(np.argmax(FakeRunner(t).logits_after(ref)[:V])))
    assert ctx[:20] == ref[:20]


def test_a_draft_that_scores_part_of_the_vocabulary_stays_exact():
    """A pruned draft lm_head (logits only for ids < 3 of 5): proposals come from that part, q is
    zero elsewhere, and the sampled distribution is still the target's."""
    params = SAMPLING[0]
    t, d = _tables(True)
    d = np.ascontiguousarray(d[..., :3])
    n = 4000
    counts = _spec_draws(t, d, params, "model", k=3, n_draws=n, seed=21)
    assert chi2_gof(counts, _exact_joint(t, [1, 3], params, 3), n) > 1e-3


@pytest.mark.parametrize("kind", ["suffix", "recycle"])
def test_free_drafters_really_propose_in_the_sampling_harness(kind):
    """The chi-square tests above are only meaningful if the free drafters proposed (and had
    tokens accepted and rejected) during them."""
    params = SAMPLING[0]
    t, _ = _tables(True)
    seen = {"drafted": 0, "accepted": 0}
    orig = speculative_round

    def counting(*a, **kw):
        r = orig(*a, **kw)
        seen["drafted"] += r.drafted
        seen["accepted"] += r.accepted
        return r

    g = globals()
    g["speculative_round"] = counting
    try:
        _spec_draws(t, t, params, kind, k=2, n_draws=300, seed=4)
    finally:
        g["speculative_round"] = orig
    assert seen["drafted"] > 100
    assert 0 < seen["accepted"] < seen["drafted"]


KEPT = [4, 0, 2]  # a pruned draft head: logits row j scores token KEPT[j] (not a prefix)


def _pruned_draft(d):
    return np.ascontiguousarray(d[..., KEPT])


@pytest.mark.parametrize("pi", [0, 1], ids=["t1", "t0.7-k4-p0.9"])
def test_a_pruned_draft_vocabulary_with_an_id_map_stays_exact(pi):
    """`--draft-vocab`: the draft scores 3 of 5 ids through a row -> id map; q is renormalised over
    the kept ids, and the sampled distribution is still the target's."""
    params = SAMPLING[pi]
    t, d = _tables(True)
    n = 4000
    counts = _spec_draws(t, _pruned_draft(d), params, "model", k=3, n_draws=n, seed=31 + pi, vocab_map=KEPT)
    assert chi2_gof(counts, _exact_joint(t, [1, 3], params, 3), n) > 1e-3


def test_a_pruned_draft_never_proposes_outside_the_kept_ids():
    t, d = _tables(False)
    rng = np.random.default_rng(0)
    drafter = ModelDrafter(FakeRunner(_pruned_draft(d)), V, adaptive=False, vocab_map=KEPT)
    for params in (SamplingParams(), *SAMPLING):
        for i in range(200):
            ctx = [int(x) for x in rng.integers(0, V, size=3)]
            drafter.begin(ctx)
            prop = drafter.propose(ctx, 3, params, rng)
            assert set(prop.tokens) <= set(KEPT)
            if prop.q is not None:
                assert prop.q.shape == (len(prop.tokens), V)
                assert np.allclose(prop.q.sum(axis=1), 1.0)
                assert not prop.q[:, [1, 3]].any()


def test_the_pruned_draft_check_can_fail():
    """Negative control: the same harness catches a q that was not renormalised over the kept ids
    (the kept rows' probabilities under the full head, here: half of each)."""
    import edgespec.drafters.model as drafters

    params = SAMPLING[0]
    t, d = _tables(False)
    orig = drafters.ModelDrafter._pick

    def unnormalised(self, row, params, rng):
        tok, c, q = orig(self, row, params, rng)
        return tok, c, None if q is None else q * 0.5

    drafters.ModelDrafter._pick = unnormalised
    try:
        counts = _spec_draws(t, _pruned_draft(d), params, "model", k=3, n_draws=3000, seed=5, vocab_map=KEPT)
    finally:
        drafters.ModelDrafter._pick = orig
    assert chi2_gof(counts, _exact_joint(t, [1, 3], params, 3), 3000) < 1e-6


@pytest.mark.parametrize("bad", [[4, 0], [4, 0, 0], [4, 0, 5], [-1, 0, 2], [[4, 0, 2]]])
def test_a_bad_vocabulary_map_is_refused(bad):
    t, d = _tables(True)
    with pytest.raises(InvalidRequest, match="draft vocabulary map"):
        ModelDrafter(FakeRunner(_pruned_draft(d)), V, vocab_map=bad)


@pytest.mark.parametrize("field,value,says", [
    ("seed", -1, "seed must be an integer from 0 to 9223372036854775807, got -1"),
    ("seed", 2**63, "seed must be an integer from 0 to 9223372036854775807"),
    ("top_k", 2**31 + 1, "top_k must be an integer from 0 (off) to 2147483648"),
])
def test_the_engine_bounds_seed_and_top_k_as_the_server_does(field, value, says):
    """limits.py's SEED_LIMIT and TOP_K_LIMIT, the HTTP layer's bounds, are the engine's too: a
    Python caller gets the same refusal, naming the parameter, before anything runs."""
    from edgespec.limits import SEED_LIMIT, TOP_K_LIMIT

    with pytest.raises(InvalidRequest, match=says.replace("(", r"\(").replace(")", r"\)")) as e:
        SamplingParams(**{field: value})
    assert e.value.param == field
    assert SamplingParams(seed=SEED_LIMIT, top_k=TOP_K_LIMIT).seed == SEED_LIMIT  # the bounds themselves pass
