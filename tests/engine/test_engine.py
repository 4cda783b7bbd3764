"""Engine behaviour on the tiny fp32 bundles: bad input, stop conditions, prefix reuse, streaming,
cancel, stats, the governor hooks."""
from __future__ import annotations

import dataclasses
import threading

import pytest

from edgespec import Engine
from edgespec.edge.governor import Limits
from edgespec.engine.round import Governor
from edgespec.errors import DraftUnavailable, InvalidRequest, PromptTooLong


@pytest.fixture(scope="module")
def eng(tiny_bundle):
    return Engine.open(tiny_bundle, max_len=128)


@pytest.fixture(scope="module")
def fresh(tiny_bundle):
    """A second engine over the same bundle: 'a fresh run' to compare reuse against."""
    return Engine.open(tiny_bundle, max_len=128)


def fresh_generate(e: Engine, **kw):
    e.reset_cache()
    return e.generate(**kw)


# --- bad input: each has its own specific error and loses nothing --------------------------------
def test_prompt_longer_than_the_cache_is_refused_and_nothing_is_written(eng):
    before = eng.generate("def add(a, b):", max_new_tokens=8, draft="none")
    length, cached = eng.target.length, eng.cached()
    long_prompt = "def add(a, b): return a + b\n" * 40
    assert eng.count_tokens(long_prompt) > eng.max_len
    with pytest.raises(PromptTooLong) as e:
        eng.generate(long_prompt, max_new_tokens=4)
    assert e.value.param == "prompt" and str(eng.max_len) in str(e.value)
    assert eng.target.length == length and eng.cached() == cached  # untouched
    # the boundary: max_len - 1 prompt tokens still get one new token; max_len do not fit
    fit = next(" a" * n for n in range(100, 200) if eng.count_tokens(" a" * n) == eng.max_len - 1)
    r = eng.generate(fit, max_new_tokens=5)
    # the newest token needs no cache slot: one from the prefill, one after feeding it
    assert r.stats.new_tokens == 2 and r.finish_reason == "cache_full"
    over = next(" a" * n for n in range(100, 200) if eng.count_tokens(" a" * n) == eng.max_len)
    with pytest.raises(PromptTooLong):
        eng.generate(over, max_new_tokens=1)
    assert eng.target.length <= eng.max_len
    assert eng.generate("def add(a, b):", max_new_tokens=8, draft="none").token_ids == before.token_ids


@pytest.mark.parametrize("kw,param", [
    (dict(prompt=""), "prompt"),
    (dict(prompt=None), "prompt"),
    (dict(prompt=123), "prompt"),
    (dict(prompt="x", messages=[{"role": "user", "content": "x"}]), "prompt"),
    (dict(messages=[]), "messages"),
    (dict(messages=[{"role": "wizard", "content": "x"}]), "messages"),
    (dict(messages=[{"role": "user", "content": 5}]), "messages"),
    (dict(prompt="x", max_new_tokens=0), "max_new_tokens"),
    (dict(prompt="x", max_new_tokens=-3), "max_new_tokens"),
    (dict(prompt="x", max_new_tokens=2.5), "max_new_tokens"),
    (dict(prompt="x", temperature=-0.5), "temperature"),
    (dict(prompt="x", top_p=0.0), "top_p"),
    (dict(prompt="x", top_p=1.5), "top_p"),
    (dict(prompt="x", top_k=-1), "top_k"),
    (dict(prompt="x", draft="magic"), "draft"),
    (dict(prompt="x", k=0), "k"),
    (dict(prompt="x", k=99), "k"),
    (dict(prompt="x", stop=[""]), "stop"),
    (dict(prompt="x", stop=[1]), "stop"),
    (dict(prompt="x", cancel=42), "cancel"),
])
def test_bad_request_parameters_are_specific_errors(eng, kw, param):
    with pytest.raises(InvalidRequest) as e:
        eng.generate(**kw)
    assert e.value.param == param, str(e.value)
    with pytest.raises(InvalidRequest):  # the stream refuses before anything runs, too
        eng.stream(**kw)


def test_bad_input_does_not_disturb_the_next_request(eng, fresh):
    for kw in (dict(prompt=""), dict(prompt="x", top_p=2.0), dict(prompt="x", draft="nope")):
        with pytest.raises(InvalidRequest):
            eng.generate(**kw)
    r = eng.generate("class Stack:", max_new_tokens=20)
    assert r.token_ids == fresh_generate(fresh, prompt="class Stack:", max_new_tokens=20, draft="none").token_ids


def test_unknown_drafter_at_open(tiny_bundle):
    with pytest.raises(InvalidRequest) as e:
        Engine.open(tiny_bundle, draft="magic")
    assert e.value.param == "draft" and "magic" in str(e.value)


def test_draft_model_on_a_bundle_without_one(tiny_bundle_nodraft):
    with pytest.raises(DraftUnavailable) as e:
        Engine.open(tiny_bundle_nodraft, draft="model")
    assert "no draft model" in str(e.value)
    e2 = Engine.open(tiny_bundle_nodraft)  # auto works: n-gram only
    assert not e2.has_draft
    with pytest.raises(DraftUnavailable):
        e2.generate("x", draft="model")
    r = e2.generate("def add(a, b):", max_new_tokens=16, draft="auto")
    ref = e2.generate("def add(a, b):", max_new_tokens=16, draft="none")
    assert r.stats.rounds_by_source.get("model", 0) == 0 and r.token_ids == ref.token_ids
    assert r.stats.new_tokens == len(r.token_ids) and (r.finish_reason != "length" or len(r.token_ids) == 16)


def test_draft_model_not_loaded_when_opened_for_ngram(tiny_bundle):
    e = Engine.open(tiny_bundle, draft="ngram")
    assert not e.has_draft
    with pytest.raises(DraftUnavailable) as err:
        e.generate("x", draft="model")
    assert "not loaded" in str(err.value)


def test_bad_max_len(tiny_bundle):
    with pytest.raises(InvalidRequest):
        Engine.open(tiny_bundle, max_len=1)


# --- stop conditions -----------------------------------------------------------------------------
def test_max_new_tokens_and_stats(eng):
    for mode in ("none", "model", "ngram", "auto"):
        r = eng.generate("def greet(name):", max_new_tokens=17, draft=mode)
        s = r.stats
        assert r.finish_reason in ("length", "stop")
        if r.finish_reason == "length":
            assert len(r.token_ids) == 17
        assert s.new_tokens == len(r.token_ids)
        assert s.prompt_tokens == eng.count_tokens("def greet(name):")
        assert s.tokens_per_pass == pytest.approx(s.new_tokens / s.target_passes)
        assert s.accepted <= s.drafted
        assert s.drafter == mode
        assert s.ttft_s > 0 and s.total_s >= s.ttft_s
        assert s.tokens_per_second == s.decode_tokens_per_second
        if mode == "none":
            assert s.drafted == 0 and s.target_passes == s.new_tokens
        assert sum(s.rounds_by_source.values()) == s.rounds == s.target_passes - 1


def test_eos_stops_generation(eng):
    """Make EOS the model's greedy choice by declaring the token it picks an EOS id."""
    ref = eng.generate("def add(a, b):", max_new_tokens=12, draft="none")
    saved = eng.vocab
    try:
        eng.vocab = dataclasses.replace(saved, eos_ids=frozenset({ref.token_ids[5]}))
        for mode in ("none", "model", "auto"):
            r = eng.generate("def add(a, b):", max_new_tokens=12, draft=mode)
            first = ref.token_ids.index(ref.token_ids[5])
            assert r.finish_reason == "stop" and r.token_ids == ref.token_ids[:first]
    finally:
        eng.vocab = saved


def test_stop_string_split_across_tokens(eng):
    """A stop string made of the end of one token's text and the start of the next: the text ends
    right before it, no streamed delta ever shows a piece of it, in every drafting mode."""
    prompt = "def add(a, b):"
    ref = eng.generate(prompt, max_new_tokens=40, draft="none")
    pieces = [eng.tokenizer.decode([t]) for t in ref.token_ids]
    # a boundary where both sides are clean text of 2+ chars
    at = next(i for i in range(2, len(pieces) - 1)
              if len(pieces[i]) >= 2 and len(pieces[i + 1]) >= 2 and "\ufffd" not in pieces[i] + pieces[i + 1])
    stop = pieces[at][-2:] + pieces[at + 1][:2]
    expected = ref.text[: ref.text.find(stop)]
    for mode in ("none", "model", "ngram", "auto"):
        deltas = list(s := eng.stream(prompt, max_new_tokens=40, draft=mode, stop=["NEVER", stop]))
        r = s.result
        assert r.finish_reason == "stop" and r.text == expected == "".join(deltas)
        shown = ""
        for d in deltas:
            shown += d
            assert stop not in shown
            assert not any(shown.endswith(stop[:n]) and len(shown) > len(expected) for n in range(1, len(stop)))


def test_cache_full(tiny_bundle):
    e = Engine.open(tiny_bundle, max_len=40)
    for mode in ("none", "model", "auto"):
        r = e.generate("def add(a, b):", max_new_tokens=500, draft=mode)
        assert r.finish_reason == "cache_full"
        # every slot used, none past the end (the newest token is not fed, so needs no slot)
        assert r.stats.prompt_tokens + r.stats.new_tokens == 41
        assert e.target.length <= 40


def test_cancel_before_and_during(eng):
    ev = threading.Event()
    ev.set()
    r = eng.generate("def add(a, b):", max_new_tokens=30, cancel=ev)
    assert r.finish_reason == "cancelled" and r.token_ids == []
    ref = eng.generate("def add(a, b):", max_new_tokens=30, draft="none")
    eng.reset_cache()
    n0 = eng.count_tokens("def add(a, b):")
    # the cache holds the prompt after the first pass and one token more after each pass since
    r = eng.generate("def add(a, b):", max_new_tokens=30, draft="none", cancel=lambda: eng.target.length >= n0 + 4)
    assert r.finish_reason == "cancelled"
    assert r.token_ids == ref.token_ids[:5]  # the 5th pass wrote the 5th token ...
    assert r.stats.target_passes == 5  # ... and the cancel was seen before a 6th


# --- prefix reuse --------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["none", "model", "ngram", "auto"])
def test_multi_turn_reuse_equals_a_fresh_run(eng, fresh, mode):
    msgs = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "def add(a, b):"}]
    eng.reset_cache()
    r1 = eng.generate(messages=msgs, max_new_tokens=24, draft=mode)
    msgs2 = msgs + [{"role": "assistant", "content": r1.text}, {"role": "user", "content": "class Stack:"}]
    r2 = eng.generate(messages=msgs2, max_new_tokens=24, draft=mode)
    assert r2.stats.cached_tokens > eng.count_tokens(messages=msgs) // 2  # the first turn was reused
    f2 = fresh_generate(fresh, messages=msgs2, max_new_tokens=24, draft=mode)
    assert f2.stats.cached_tokens == 0
    assert r2.token_ids == f2.token_ids and r2.text == f2.text
    # sampling with a seed is reproducible across reuse as well, when no round's shape is measured
    # (fixed k, chains; adaptive k and tree="auto" change how the seed's numbers are consumed)
    if mode != "auto":
        kw = dict(max_new_tokens=16, temperature=0.9, seed=3, draft=mode, k=None if mode == "none" else 3,
                  tree="off")
        s1 = eng.generate(messages=msgs2, **kw)
        s2 = fresh_generate(fresh, messages=msgs2, **kw)
        assert s1.token_ids == s2.token_ids


def test_same_prompt_twice_reuses_all_but_the_last_token(eng):
    a = eng.generate("def greet(name):", max_new_tokens=10)
    b = eng.generate("def greet(name):", max_new_tokens=10)
    assert b.stats.cached_tokens == b.stats.prompt_tokens - 1
    assert a.token_ids == b.token_ids


def test_an_error_mid_generation_resets_the_cache(eng, fresh, monkeypatch):
    eng.generate("def add(a, b):", max_new_tokens=10)
    calls = {"n": 0}
    real = eng.target.step

    def failing(tokens, n_logits=1):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("boom")
        return real(tokens, n_logits)

    monkeypatch.setattr(eng.target, "step", failing)
    with pytest.raises(RuntimeError):
        # one target step per token (no drafting: the suffix index has seen this answer and could
        # copy it in one pass), so the third step is always reached
        eng.generate("def add(a, b):", max_new_tokens=10, draft="none")
    monkeypatch.undo()
    assert eng.target.length == 0 and eng.cached() == []
    r = eng.generate("class Stack:", max_new_tokens=12)
    assert r.token_ids == fresh_generate(fresh, prompt="class Stack:", max_new_tokens=12).token_ids


@pytest.mark.parametrize("draft", ["none", "auto"])
def test_closing_a_stream_keeps_the_cache_for_the_next_turn(eng, fresh, draft):
    """A kiosk visitor presses Stop: the stream is closed after a few deltas. The caches are
    consistent between rounds, so the next turn (the conversation so far + a new question) reuses
    the whole previous prompt, and its output is still what a fresh engine writes."""
    eng.reset_cache()
    turn1 = [{"role": "user", "content": "Write a function that adds two numbers."}]
    s = eng.stream(messages=turn1, max_new_tokens=40, draft=draft)
    partial = "".join(next(s) for _ in range(3))
    s.close()
    assert s.result is None  # ended early: no result
    prompt1 = eng.encode(messages=turn1)
    assert eng.cached()[: len(prompt1)] == prompt1  # the previous turn is still in the cache
    turn2 = turn1 + [{"role": "assistant", "content": partial}, {"role": "user", "content": "Now subtract."}]
    r = eng.generate(messages=turn2, max_new_tokens=12, draft=draft)
    assert r.stats.cached_tokens >= len(prompt1)
    assert r.token_ids == fresh_generate(fresh, messages=turn2, max_new_tokens=12, draft=draft).token_ids


def test_an_exception_inside_a_stream_still_invalidates(eng):
    """Only a clean close keeps the cache: any other exception thrown into the generation drops it."""
    eng.generate("def add(a, b):", max_new_tokens=4)
    s = eng.stream("def sub(a, b):", max_new_tokens=40, draft="none")
    next(s)
    with pytest.raises(KeyboardInterrupt):
        s._gen.throw(KeyboardInterrupt())
    assert eng.cached() == []


# --- streaming -----------------------------------------------------------------------------------
def test_stream_deltas_add_up_and_unicode_survives(eng):
    prompt = "Grüße aus München, 東京, Привет мир, emoji 🙂 and ✓"
    for mode in ("none", "model", "auto"):
        s = eng.stream(prompt, max_new_tokens=40, draft=mode)
        assert s.result is None and s.prompt_tokens == eng.count_tokens(prompt)
        deltas = list(s)
        assert "".join(deltas) == s.result.text
        assert all(isinstance(d, str) and d for d in deltas)


def test_breaking_out_of_a_stream_frees_the_engine(eng, fresh):
    s = eng.stream("def add(a, b):", max_new_tokens=50)
    next(iter(s))
    s.close()
    r = eng.generate("class Stack:", max_new_tokens=12)  # would deadlock if the lock were held
    assert r.token_ids == fresh_generate(fresh, prompt="class Stack:", max_new_tokens=12).token_ids


def test_concurrent_requests_are_serialised(eng, fresh):
    prompts = ["def add(a, b):", "class Stack:", "for i in range(10):", "The quick brown fox"]
    want = {p: fresh_generate(fresh, prompt=p, max_new_tokens=20).token_ids for p in prompts}
    got = {}

    def work(p):
        got[p] = eng.generate(p, max_new_tokens=20).token_ids

    threads = [threading.Thread(target=work, args=(p,)) for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == want


# --- vocabulary, chat template, sampling ---------------------------------------------------------
def test_only_usable_ids_are_ever_chosen(eng):
    assert eng.vocab.usable < eng.target.vocab_size  # the tiny models have padding rows
    for mode in ("none", "model", "ngram", "auto"):
        for seed in range(3):
            r = eng.generate("def add(a, b):", max_new_tokens=30, temperature=3.0, seed=seed, draft=mode)
            assert max(r.token_ids, default=0) < eng.vocab.usable


@pytest.mark.parametrize("draft,k", [("none", None), ("model", 2), ("ngram", 3)])
def test_sampling_is_reproducible_with_a_seed(eng, draft, k):
    kw = dict(max_new_tokens=20, temperature=0.8, top_p=0.9, draft=draft, k=k, tree="off")
    a = eng.generate("def add(a, b):", seed=11, **kw)
    b = eng.generate("def add(a, b):", seed=11, **kw)
    c = eng.generate("def add(a, b):", seed=12, **kw)
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids


def test_chat_template_is_the_bundles(eng):
    msgs = [{"role": "user", "content": "hi"}]
    ids = eng.encode(messages=msgs)
    assert eng.tokenizer.decode(ids, skip_special_tokens=False) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_no_chat_template(tiny_bundle, bundle_copy):
    import json

    from edgespec.models.manifest import MANIFEST_NAME

    e = Engine.open(tiny_bundle, max_len=64)
    e.bundle.manifest.tokenizer.chat_template = None  # as a bundle exported without one
    try:
        with pytest.raises(InvalidRequest) as err:
            e.generate(messages=[{"role": "user", "content": "hi"}])
        assert "chat template" in str(err.value)
    finally:
        e.bundle.manifest.tokenizer.chat_template = json.loads(
            (tiny_bundle / MANIFEST_NAME).read_text())["tokenizer"]["chat_template"]


# --- governor hooks ------------------------------------------------------------------------------
class FakeGovernor(Governor):
    """A governor whose limits the test sets (the loop's Governor protocol)."""

    def __init__(self, max_k=None, drafting="any", pace_s=0.0):
        self.lim = Limits(max_k=max_k, drafting=drafting, pace_s=pace_s)
        self.tokens = 0
        self.calls = 0

    def limits(self):
        self.calls += 1
        return self.lim

    def on_tokens(self, n):
        self.tokens += n

    def mark(self):
        return (0.0, self.tokens)

    def j_per_token_since(self, mark):
        return 0.5

    def close(self):
        pass


@pytest.mark.parametrize("lim,check", [
    (dict(max_k=1), lambda s: s.k_mean <= 1.0),
    (dict(drafting="none"), lambda s: s.drafted == 0),
    (dict(drafting="ngram"), lambda s: s.rounds_by_source.get("model", 0) == 0),
])
def test_governor_limits_change_speed_not_text(eng, fresh, lim, check):
    ref = fresh_generate(fresh, prompt="def add(a, b):", max_new_tokens=30, draft="none")
    gov = FakeGovernor(**lim)
    eng.governor = gov
    try:
        r = eng.generate("def add(a, b):", max_new_tokens=30, draft="auto", k=6)
    finally:
        eng.governor = None
    assert r.token_ids == ref.token_ids
    assert check(r.stats)
    assert gov.calls == r.stats.rounds and gov.tokens >= r.stats.new_tokens - 1
    assert r.stats.energy_j_per_token == 0.5


def test_no_governor_means_no_energy_figure(eng):
    assert eng.generate("x", max_new_tokens=3).stats.energy_j_per_token is None


def test_memory_budget_that_drops_the_draft(tiny_bundle):
    memory = pytest.importorskip("edgespec.edge.memory")
    b_full = memory.plan(tiny_bundle, max_len=128, want_draft=True, budget_bytes=None)
    b_target = memory.plan(tiny_bundle, max_len=128, want_draft=False, budget_bytes=None)
    budget = (b_full.predicted_bytes + b_target.predicted_bytes) // 2
    e = Engine.open(tiny_bundle, max_len=128, memory_budget=budget)
    assert not e.has_draft
    r = e.generate("def add(a, b):", max_new_tokens=8)
    assert r.token_ids == e.generate("def add(a, b):", max_new_tokens=8, draft="none").token_ids
    assert r.stats.rounds_by_source.get("model", 0) == 0  # no draft model: it never drafted
    with pytest.raises(DraftUnavailable):
        Engine.open(tiny_bundle, max_len=128, memory_budget=budget, draft="model")


def test_rng_is_per_request(eng):
    """Two interleaved seeded requests give what each gives alone (no shared random state)."""
    kw = dict(max_new_tokens=12, temperature=1.0, draft="model", k=2, tree="off")
    alone = eng.generate("class Stack:", seed=5, **kw).token_ids
    s = eng.stream("class Stack:", seed=5, **kw)
    eng.generate("def add(a, b):", seed=6, **kw)
    for _ in s:
        pass
    assert s.result.token_ids == alone


# --- the face over the one engine ------------------------------------------------------------------
def test_threads_calling_generate_share_the_engines_rounds(tiny_bundle, monkeypatch):
    """Engine.generate is a synchronous face over the one engine: three threads calling it at once on
    a 3-slot engine ride in the same rounds (one pass verifies several of them) and each gets the
    tokens it gets alone. The first round waits until all three are submitted, so the sharing does not
    depend on which thread gets there first."""
    from helpers.wait import wait_for

    eng = Engine.open(tiny_bundle, parallel=3, max_len=256, draft="none", deterministic=True, warmup=False)
    alone = Engine.open(tiny_bundle, max_len=256, draft="none", deterministic=True, warmup=False)
    prompts = ["def add(a, b):", "class Stack:", "x = [1, 2"]
    want = [alone.generate(p, max_new_tokens=24).token_ids for p in prompts]
    submitted, submit, first_round = [], eng.submit, eng.round
    monkeypatch.setattr(eng, "submit", lambda *a, **kw: submitted.append(1) or submit(*a, **kw))

    def round_once_all_are_in():
        wait_for("all three requests submitted", lambda: len(submitted) == 3, timeout=60, every=0.01)
        return first_round()

    monkeypatch.setattr(eng, "round", round_once_all_are_in)
    got: list = [None] * 3

    def ask(i: int) -> None:
        got[i] = eng.generate(prompts[i], max_new_tokens=24)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a generate call never returned"
    assert [g.token_ids for g in got] == want
    assert max(g.stats.batch_size_mean for g in got) > 1  # they shared passes
    eng.close()
    alone.close()
