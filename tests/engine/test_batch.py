"""Continuous batching: each request gets exactly what it would get alone, whoever shares its rounds."""
from __future__ import annotations

import threading

import pytest

from edgespec.core.steptimes import BatchTimes
from edgespec.core.runner import StepTimes
from edgespec.engine import Engine
from edgespec.errors import DraftUnavailable, InvalidRequest
from helpers.batch import generate_all

PROMPTS = [
    "def add(a, b):\n    return a + b\n\ndef add(a, b):",
    "hello hello hello world",
    "the quick brown fox jumps over the lazy dog. the quick brown",
    "1 2 3 4 5 6 7 8 9 10 1 2 3",
    "x",
]


@pytest.fixture(scope="module")
def alone(tiny_bundle):
    eng = Engine.open(tiny_bundle, draft="none", verify=False, warmup=False)
    yield eng
    eng.close()


def _alone(eng, **kw):
    eng.reset_cache()
    return eng.generate(**kw)


@pytest.fixture(scope="module")
def batch(tiny_bundle):
    return Engine.open(tiny_bundle, parallel=3, draft="auto", max_len=160, verify=False)


@pytest.mark.parametrize("draft,k", [("none", None), ("ngram", None), ("ngram", 3), ("suffix", None), ("suffix", 5),
                                     ("auto", None), ("model", None), ("model", 3), ("recycle", None), ("recycle", 2)])
def test_greedy_batch_equals_alone(batch, alone, draft, k):
    reqs = [dict(prompt=p, max_new_tokens=24 + 7 * i, draft=draft, k=k) for i, p in enumerate(PROMPTS)]
    got = generate_all(batch, reqs)  # 5 requests, 3 slots: two join as the first ones leave
    for r, g in zip(reqs, got):
        want = _alone(alone, prompt=r["prompt"], max_new_tokens=r["max_new_tokens"])
        assert g.token_ids == want.token_ids, r
        assert g.text == want.text
        assert g.finish_reason == want.finish_reason
    assert batch.active == 0 and batch.waiting == 0


def test_requests_join_mid_generation(batch, alone):
    """A request submitted while others are generating joins at the next round and changes nothing."""
    first = batch.submit(PROMPTS[0], max_new_tokens=40, draft="ngram")
    for _ in range(5):
        batch.round()
    assert first.result is None  # still generating when the next ones come in
    later = [batch.submit(p, max_new_tokens=30, draft="none") for p in PROMPTS[1:3]]
    while batch.round():
        pass
    assert first.wait(0).token_ids == _alone(alone, prompt=PROMPTS[0], max_new_tokens=40).token_ids
    for p, t in zip(PROMPTS[1:3], later):
        assert t.wait(0).token_ids == _alone(alone, prompt=p, max_new_tokens=30).token_ids
    assert first.wait(0).stats.batch_size_mean > 1  # it did share rounds


def test_sampled_requests_keep_their_seeds(batch, alone):
    reqs = [dict(prompt=p, max_new_tokens=20, temperature=0.9, top_p=0.95, seed=10 + i, draft=d, k=kk)
            for i, (p, d, kk) in enumerate(zip(PROMPTS, ["none", "ngram", "none", "ngram", "none"],
                                                [None, 2, None, 3, None]))]
    got = generate_all(batch, reqs)
    for r, g in zip(reqs, got):
        want = _alone(alone, tree="off", **r)  # batched rounds are chains; a measured tree choice would
        assert g.token_ids == want.token_ids, r  # draw the seed's numbers in another order


class _FrozenStep(StepTimes):
    """A pass costs 10 ms at any width, whatever the machine is doing (adding times does nothing)."""

    def __init__(self):
        super().__init__()
        for s in range(1, 17):
            for _ in range(2):
                super().add(s, 0.01)

    def add(self, n_tokens: int, seconds: float) -> None:
        pass


class _FlatTimes(BatchTimes):
    def table(self, rows: int) -> StepTimes:
        return self.by_rows.setdefault(rows, _FrozenStep())


def test_adaptive_rows_are_cut_to_the_rounds_width(batch, alone, monkeypatch):
    """The batch's width choice (round_shape.py) is applied: with the width pinned to 2, adaptive
    rows carry at most one proposal, a client's fixed k is never cut (and sets the width), and every
    output is still what the request gets alone."""
    import edgespec.engine.round as round_mod

    monkeypatch.setattr(round_mod, "choose_width",
                        lambda rows, pass_seconds: max([2] + [r.proposed + 1 for r in rows if r.fixed]))
    monkeypatch.setattr(batch.runner, "times", _FlatTimes())  # every width costs the same: rows go wide
    passes: list[list[int]] = []
    orig = batch.runner.step
    monkeypatch.setattr(batch.runner, "step", lambda rows: passes.append([len(t) for t in rows.values()])
                        or orig(rows))

    def run(reqs):
        passes.clear()
        for r, g in zip(reqs, generate_all(batch, reqs)):
            assert g.token_ids == _alone(alone, prompt=r["prompt"], max_new_tokens=30).token_ids, r
        return [w for p in passes if len(p) > 1 for w in p]  # a row alone is not cut: no batch to fit

    widths = run([dict(prompt=PROMPTS[0], max_new_tokens=30, draft="ngram"),
                  dict(prompt=PROMPTS[1], max_new_tokens=30, draft="auto"),
                  dict(prompt=PROMPTS[2], max_new_tokens=30, draft="ngram")])
    assert max(widths) == 2  # proposals were made, and cut to one
    run([dict(prompt=PROMPTS[0], max_new_tokens=30, draft="ngram", k=4),
         dict(prompt=PROMPTS[1], max_new_tokens=30, draft="ngram"),
         dict(prompt=PROMPTS[2], max_new_tokens=30, draft="ngram")])
    assert any(w > 2 for p in passes for w in p)  # the fixed-k row kept its length, and the
    assert all(max(p) <= 5 for p in passes)  # others used at most the width it forced (paid anyway)


def test_slots_at_the_cache_limit(tiny_bundle, alone):
    """Requests that run into the end of their slot's cache end with cache_full, as alone."""
    be = Engine.open(tiny_bundle, parallel=2, max_len=48, verify=False, warmup=False)
    small = Engine.open(tiny_bundle, draft="none", max_len=48, verify=False, warmup=False)
    reqs = [dict(prompt=p, max_new_tokens=200, draft=d) for p, d in zip(PROMPTS[:3], ["ngram", "none", "auto"])]
    got = generate_all(be, reqs)
    for r, g in zip(reqs, got):
        small.reset_cache()
        want = small.generate(prompt=r["prompt"], max_new_tokens=200)
        assert g.finish_reason == want.finish_reason == "cache_full"
        assert g.token_ids == want.token_ids


def test_rows_of_different_widths_near_the_cache_end(tiny_bundle):
    """Three requests a few positions from the end of their slots, drafting with different fixed k,
    one engine for several such batches: a row padded to a wider row's width (or a slot that ended
    full, idle inside the pass's block) would run past its cache, which the operator refuses
    (ModelRunner.step then runs the rows alone). Each gets the target alone's tokens and ending."""
    import numpy as np

    be = Engine.open(tiny_bundle, parallel=3, max_len=64, draft="auto", verify=False, warmup=False)
    small = Engine.open(tiny_bundle, draft="none", max_len=64, verify=False, warmup=False)
    rng = np.random.default_rng(7)
    for free in (3, 8, 12, 20):
        reqs = []
        for j, (mode, k) in enumerate([("model", 4), ("suffix", 1), ("ngram", 2)]):
            ids = rng.integers(3, small.vocab.usable, size=64).tolist()
            m = 64
            while small.count_tokens(small.tokenizer.decode(ids[:m])) > 64 - free - 2 * j:
                m -= 1
            reqs.append(dict(prompt=small.tokenizer.decode(ids[:m]), max_new_tokens=100, draft=mode, k=k))
        got = generate_all(be, reqs)
        for r, g in zip(reqs, got):
            small.reset_cache()
            want = small.generate(prompt=r["prompt"], max_new_tokens=100)
            assert g.token_ids == want.token_ids, (free, r["draft"])
            assert g.finish_reason == want.finish_reason == "cache_full"


def test_prefix_reuse_lands_in_the_slot_holding_it(tiny_bundle, alone):
    be = Engine.open(tiny_bundle, parallel=3, max_len=160, verify=False, warmup=False)
    a = generate_all(be, [dict(prompt=PROMPTS[2], max_new_tokens=8, draft="none"),
                          dict(prompt=PROMPTS[0], max_new_tokens=8, draft="none")])
    turn2 = PROMPTS[0] + a[1].text + " more"
    t = be.submit(turn2, max_new_tokens=8, draft="none")
    while be.round():
        pass
    r = t.wait(0)
    assert r.stats.cached_tokens >= len(be.encode(PROMPTS[0]))
    assert r.token_ids == _alone(alone, prompt=turn2, max_new_tokens=8).token_ids


def test_cancel_frees_the_slot_and_the_others_finish(batch, alone):
    stop = threading.Event()
    victim = batch.submit(PROMPTS[1], max_new_tokens=60, draft="none", cancel=stop)
    others = [batch.submit(p, max_new_tokens=25, draft="ngram") for p in (PROMPTS[0], PROMPTS[3])]
    waiting = batch.submit(PROMPTS[4], max_new_tokens=10, draft="none")  # no slot until one frees
    for _ in range(4):
        batch.round()
    assert waiting.result is None
    stop.set()
    while batch.round():
        pass
    assert victim.wait(0).finish_reason == "cancelled"
    for p, t in zip((PROMPTS[0], PROMPTS[3]), others):
        assert t.wait(0).token_ids == _alone(alone, prompt=p, max_new_tokens=25).token_ids
    assert waiting.wait(0).token_ids == _alone(alone, prompt=PROMPTS[4], max_new_tokens=10).token_ids


def test_streamed_deltas_join_to_the_text(batch):
    parts: dict[int, list[str]] = {0: [], 1: []}
    ts = [batch.submit(PROMPTS[i], max_new_tokens=20, draft="auto", on_delta=parts[i].append) for i in (0, 1)]
    while batch.round():
        pass
    for i, t in enumerate(ts):
        r = t.wait(0)
        assert len(parts[i]) > 1 and "".join(parts[i]) == r.text and r.text


@pytest.mark.parametrize("mode", ["self", "heads"])
def test_a_drafter_this_batch_did_not_load_is_refused_by_name(batch, mode):
    """The self-draft and the heads run batched (test_lossless_batch_features.py); an engine opened
    without them (draft="auto" here, a bundle without heads) refuses a request for them in one line."""
    with pytest.raises(DraftUnavailable, match=f"draft='{mode}' is not possible") as e:
        batch.submit("x", draft=mode)
    assert e.value.param == "draft" and "\n" not in str(e.value)


def test_the_draft_model_drafts_for_every_request_in_one_batched_step(batch, alone, monkeypatch):
    """Three requests drafting with the draft model share its steps (engine/draft_batch.py): a
    draft step of the round runs every request's row, each request's proposals are accepted, and
    the outputs are what each gets alone."""
    steps: list[int] = []
    draft = batch._draft_batch.runner
    orig = draft.step
    monkeypatch.setattr(draft, "step", lambda rows: steps.append(len(rows)) or orig(rows))
    reqs = [dict(prompt=p, max_new_tokens=30, draft="model", k=3) for p in PROMPTS[:3]]
    got = generate_all(batch, reqs)
    for r, g in zip(reqs, got):
        assert g.token_ids == _alone(alone, prompt=r["prompt"], max_new_tokens=30).token_ids, r
        assert g.stats.accepted_by_source.get("model", 0) > 0 and g.stats.rounds_by_source.get("model", 0) > 0
    assert max(steps) == 3  # one draft step carried all three requests' rows
    assert not batch._drafters._parts  # nothing kept of the requests once they ended


def test_the_draft_model_batches_on_a_graph_without_per_row_lengths(tiny_cuda_bundle, alone):
    """The cuda-flavored draft (no query_seqlens: its batched steps run per row, core/runner.py)
    drafts for several requests too, and each gets what it gets alone (on the CPU provider)."""
    import onnxruntime

    from edgespec.edge.flavor import cpu_runs_float16
    from edgespec.models.kernels import floor_problem

    if not cpu_runs_float16() or floor_problem(onnxruntime.__version__, "cuda") is not None:
        pytest.skip("the cuda flavor does not run on this CPU / onnxruntime")
    be = Engine.open(tiny_cuda_bundle, parallel=3, draft="model", max_len=160, verify=False, providers="cpu")
    ref = Engine.open(tiny_cuda_bundle, draft="none", max_len=160, verify=False, warmup=False, providers="cpu")
    reqs = [dict(prompt=p, max_new_tokens=24, draft="model", k=3) for p in PROMPTS[:3]]
    for r, g in zip(reqs, generate_all(be, reqs)):
        assert g.token_ids == _alone(ref, prompt=r["prompt"], max_new_tokens=24).token_ids, r
        assert g.stats.rounds_by_source.get("model", 0) > 0
    be.close()
    ref.close()


def test_a_limit_to_free_drafts_swaps_in_each_requests_fallback(tiny_bundle, alone):
    """The governor's "free drafts only" (a power limit) reaches batched rounds: a request drafting
    with the draft model drafts from its suffix index instead, and its output is unchanged."""
    from types import SimpleNamespace

    class Free:
        def limits(self):
            return SimpleNamespace(max_k=None, drafting="ngram", pace_s=0.0)

        def on_tokens(self, n):
            self.tokens = getattr(self, "tokens", 0) + n

        def mark(self):
            return None

        def j_per_token_since(self, mark):
            return None

        def close(self):
            pass

    be = Engine.open(tiny_bundle, parallel=2, draft="model", max_len=160, verify=False, warmup=False)
    be.governor = gov = Free()
    got = generate_all(be, [dict(prompt=PROMPTS[0], max_new_tokens=30, draft="model", k=3),
                            dict(prompt=PROMPTS[1], max_new_tokens=30, draft="auto")])
    for p, g in zip(PROMPTS[:2], got):
        assert g.token_ids == _alone(alone, prompt=p, max_new_tokens=30).token_ids
        assert "model" not in g.stats.rounds_by_source
    assert got[0].stats.rounds_by_source.get("suffix", 0) > 0 and got[0].stats.drafted > 0  # its fallback drafted
    # it heard of every round's tokens (the first of each request comes from its prefill; a round may
    # write past a stop)
    assert gov.tokens >= sum(len(g.token_ids) for g in got) - 2
    be.close()


def test_every_tree_mode_runs_in_a_batch(batch, alone):
    """tree="on" runs batched (its rounds trees verified alone on its slot: test_lossless_batch_features.py),
    "auto" and "off" chain; an unknown mode is refused."""
    with pytest.raises(InvalidRequest, match="unknown tree mode"):
        batch.submit("x", tree="sideways")
    for tree in ("on", "auto", "off"):
        got = batch.generate(PROMPTS[0], max_new_tokens=12, tree=tree, draft="ngram")
        assert got.token_ids == _alone(alone, prompt=PROMPTS[0], max_new_tokens=12).token_ids
        assert got.stats.tree == ("on" if tree == "on" else "off")


def test_tree_on_is_refused_by_name_on_a_graph_without_attention_bias(tiny_cuda_bundle):
    """The cuda-flavored graph has no attention_bias: tree='on' is refused at open and per request,
    before admission, naming the input."""
    with pytest.raises(InvalidRequest, match="tree='on' is not possible with bundle .*attention_bias"):
        Engine.open(tiny_cuda_bundle, parallel=2, tree="on", max_len=64, verify=False, warmup=False,
                         providers="cpu")
    be = Engine.open(tiny_cuda_bundle, parallel=2, max_len=64, verify=False, warmup=False, providers="cpu")
    with pytest.raises(InvalidRequest, match="attention_bias") as e:
        be.submit("x", tree="on")
    assert e.value.param == "tree" and be.waiting == 0
    be.close()


def test_suffix_history_lets_a_request_copy_an_earlier_answer(tiny_bundle, alone):
    """A finished request's prompt and answer join the shared history: the same question asked
    again (in another slot, while a different request runs beside it) is drafted from the earlier
    answer, and both outputs are still what each request gets alone."""
    be = Engine.open(tiny_bundle, parallel=2, max_len=160, verify=False, warmup=False)
    prompt = "x y z w"
    first = be.generate(prompt, max_new_tokens=40, draft="suffix", k=8)
    tickets = [be.submit(PROMPTS[3], max_new_tokens=40, draft="suffix", k=8),
               be.submit(prompt, max_new_tokens=40, draft="suffix", k=8)]
    while be.round():
        pass
    other, again = (t.wait(0) for t in tickets)
    want = _alone(alone, prompt=prompt, max_new_tokens=40).token_ids
    assert first.token_ids == again.token_ids == want
    assert other.token_ids == _alone(alone, prompt=PROMPTS[3], max_new_tokens=40).token_ids
    # the repeat's proposals came from the history: nearly every one accepted, far above the first
    assert again.stats.accepted >= 0.8 * (len(want) - 1) and again.stats.accepted > first.stats.accepted
    be.reset_cache()  # and forgotten on reset: the repeat drafts only from its own text again
    assert be.generate(prompt, max_new_tokens=40, draft="suffix", k=8).stats.accepted == first.stats.accepted
    be.close()


def test_reset_cache_forgets_slots_and_evidence_and_waits_for_no_one(tiny_bundle, alone):
    be = Engine.open(tiny_bundle, parallel=2, max_len=160, verify=False, warmup=False)
    first = be.generate(PROMPTS[0], max_new_tokens=8, draft="ngram")
    again = be.generate(PROMPTS[0], max_new_tokens=8, draft="ngram")
    assert again.stats.cached_tokens > 0  # the slot held the prompt
    be.reset_cache()
    fresh = be.generate(PROMPTS[0], max_new_tokens=8, draft="ngram")
    assert fresh.stats.cached_tokens == 0 and fresh.token_ids == first.token_ids
    t = be.submit(PROMPTS[1], max_new_tokens=4)  # waiting: a reset now would pull its slot away
    with pytest.raises(InvalidRequest, match="while requests are running"):
        be.reset_cache()
    while be.round():
        pass
    assert t.wait(0).token_ids == _alone(alone, prompt=PROMPTS[1], max_new_tokens=4).token_ids
    be.close()


SCHEMA = {"type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 999},
                                           "kind": {"enum": ["pump", "valve", "fan"]}},
          "required": ["id", "kind"], "additionalProperties": False}
LARK = 'start: "on" | "off" | "level " /[0-9]{1,3}/\n'


@pytest.mark.parametrize("draft", ["none", "grammar", "suffix", "auto"])
def test_each_batched_request_keeps_its_own_grammar(batch, alone, draft):
    """Requests with different constraints (a schema, a grammar, none) share rounds; each gets what
    the constrained target alone writes, and its answer follows its own grammar."""
    kinds = [{"json_schema": SCHEMA}, {"grammar": LARK}, {}, {"json_schema": SCHEMA}, {"grammar": LARK}]
    reqs = [dict(prompt=p, max_new_tokens=30, draft=draft, **kw) for p, kw in zip(PROMPTS, kinds)]
    got = generate_all(batch, reqs)
    for r, g in zip(reqs, got):
        kw = {n: r[n] for n in ("json_schema", "grammar") if n in r}
        want = _alone(alone, prompt=r["prompt"], max_new_tokens=30, **kw)
        assert g.token_ids == want.token_ids, r
        if "grammar" in r:
            assert g.text in ("on", "off") or g.text.startswith("level ")
        if "json_schema" in r and g.finish_reason == "stop":
            assert g.text.startswith('{"id": ') and '"kind": ' in g.text
