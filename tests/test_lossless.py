"""The heart of the suite: speculative output == target-alone output, token for token.

On the tiny fp32 bundles (exact kernels), for many random prompts, every drafter, k from 1 to 8,
both tiny architectures, a draft that agrees and one that disagrees, and prompts that end near
the cache limit. The same on the tiny cuda-flavored bundles (float16 activations, attention and KV
cache, int8 MatMulNBits), run by the CPU provider: float16 kernels could round a k-token verify
differently from a 1-token step, turning a near-tie of the top two logits; the tiny models' logits
are peaked (export/tiny.py), and 0 of 384 speculative runs (8 prompts x 3 drafters x k 1..8 x 2
drafts) differed from target-alone when this was measured, so the test asserts token identity; a
failure here on a new onnxruntime is a near-tie first, a bug second (docs/export.md, "Flavors"). Sampling: the distribution of sampled tokens on the real tiny ONNX models matches
the target's exact distribution (the many-draw version is in test_sampling.py). Batch arrangements
(engine/round.py): every drafter a batched engine runs, several requests sharing each round, gives
what the serial engine (the batch of one) gives, which is the target alone's.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from edgespec.drafters import modes
from edgespec.edge.flavor import cpu_runs_float16
from edgespec.engine import Engine
from edgespec.errors import DraftUnavailable
from edgespec.core.sampling import SamplingParams

from helpers.batch import generate_all
from helpers.costs import freeze
from helpers.lossless import MODES, check_greedy_lossless, exact_target_distribution, random_prompt
from helpers.stats import chi2_gof

@pytest.fixture(scope="module")
def engines(request, tiny_bundle, tiny_bundle_disagree, tiny_llama_bundle):
    """The fp32 bundles, and the cuda-flavored ones where this CPU runs float16 (not a Pi 4's A72) and this
    onnxruntime is at the cuda flavor's floor (scripts/ci-ort.sh runs this file on 1.23.2 too)."""
    import onnxruntime

    from edgespec.models.kernels import floor_problem

    paths = [("agree", tiny_bundle), ("disagree", tiny_bundle_disagree), ("llama", tiny_llama_bundle)]
    if cpu_runs_float16() and floor_problem(onnxruntime.__version__, "cuda") is None:
        paths += [("cuda-agree", request.getfixturevalue("tiny_cuda_bundle")),
                  ("cuda-disagree", request.getfixturevalue("tiny_cuda_bundle_disagree"))]
    return {name: Engine.open(path, max_len=256) for name, path in paths}


SEEDS = {"agree": 0, "disagree": 1, "llama": 2, "cuda-agree": 3, "cuda-disagree": 4}
NO_FP16 = ("this CPU has no float16 arithmetic, or this onnxruntime is below the cuda flavor's floor: the cuda "
           "flavor is refused here (tests/edge/test_flavor.py, tests/models/test_floor.py)")


def engine(engines, name):
    if name not in engines:
        pytest.skip(NO_FP16)
    return engines[name]


@pytest.mark.arm64
@pytest.mark.parametrize("name", list(SEEDS))
def test_greedy_equals_target_alone_quick(engines, name):
    check_greedy_lossless(engine(engines, name), 10 + SEEDS[name], 2, (1, 3, 8))


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SEEDS))
def test_greedy_every_drafter_every_k_equals_target_alone(engines, name):
    check_greedy_lossless(engine(engines, name), SEEDS[name], 8, range(1, 9))


# a schema whose answers end inside 48 tokens on the tiny models (bounded string, integer and array)
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 6}, "n": {"type": "integer", "minimum": 0, "maximum": 99},
    "tag": {"enum": ["alpha", "beta", "gamma"]}, "flags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2}},
    "required": ["name", "n", "tag", "flags"], "additionalProperties": False}
LARK = 'start: "set " DEVICE " to " NUM "%" ("; " "set " DEVICE " to " NUM "%")*\nDEVICE: /[a-z]{1,8}/\nNUM: /[0-9]{1,2}/\n'


@pytest.mark.arm64  # llguidance is native code: its aarch64 wheel masks the same tokens
@pytest.mark.parametrize("name", ["agree", "disagree", "llama"])
@pytest.mark.parametrize("kind", ["json_schema", "grammar"])
def test_greedy_under_a_grammar_equals_constrained_target_alone(engines, name, kind):
    """Structured output: every drafter (the grammar's forced tokens among them, alone and in front
    of the others' proposals), every k, gives the constrained target-alone tokens, and the answers
    follow the grammar."""
    eng = engine(engines, name)
    kw = {"json_schema": SCHEMA} if kind == "json_schema" else {"grammar": LARK}
    check_greedy_lossless(eng, 30 + SEEDS[name], 2, (1, 3, 8), modes=[*MODES, "grammar"], **kw)
    r = eng.generate("status:", max_new_tokens=48, draft="auto", **kw)
    if kind == "json_schema" and r.finish_reason == "stop":
        import json
        d = json.loads(r.text)
        assert set(d) == set(SCHEMA["properties"]) and d["tag"] in ("alpha", "beta", "gamma")
    elif kind == "grammar":
        assert r.text.startswith("set ") and " to " in r.text


@pytest.mark.arm64
def test_cuda_flavored_bundle_really_runs_float16(engines):
    """The cuda-flavored engines above really run the float16 graph (not a float32 one)."""
    for name in ("cuda-agree", "cuda-disagree"):
        eng = engine(engines, name)
        for runner in (eng.target, eng.draft_runner):
            assert runner.facts.graph_flavor() == "cuda" and runner.facts.kv_dtype == "float16"
            assert runner.runner.kv[0].data_type() == "tensor(float16)"


@pytest.mark.arm64
@pytest.mark.parametrize("bundle", ["tiny_heads_bundle", "tiny_feature_bundle"])
@pytest.mark.parametrize("k", [1, 3, None])
def test_greedy_heads_equal_target_alone(request, bundle, k):
    """Draft heads trained at export (drafters/heads.py: Medusa; drafters/feature.py: the feature
    drafter), alone and as a source of auto, every k."""
    eng = Engine.open(request.getfixturevalue(bundle), max_len=256)
    check_greedy_lossless(eng, 20, 2, (1, 3) if k is None else (k,), modes=["heads", "auto"])


@pytest.mark.arm64
def test_greedy_model_draft_accepts_when_it_agrees(engines):
    """The agreeing draft is accepted most of the time and saves target passes; the test above
    would pass vacuously if every proposal were rejected."""
    eng = engines["agree"]
    r = eng.generate("def add(a, b):", max_new_tokens=64, draft="model", k=4)
    assert r.stats.acceptance_rate > 0.5
    assert r.stats.target_passes < r.stats.new_tokens


@pytest.mark.arm64
def test_greedy_near_the_cache_limit(tiny_bundle, tiny_llama_bundle):
    """Prompts that leave 1..12 free positions: the last rounds must shrink k to fit, the output
    still equals the target's, and both stop with cache_full at the same token."""
    for path in (tiny_bundle, tiny_llama_bundle):
        eng = Engine.open(path, max_len=48)
        rng = np.random.default_rng(7)
        for free in (1, 2, 3, 5, 8, 12):
            ids = rng.integers(3, eng.vocab.usable, size=48 - free).tolist()
            prompt = eng.tokenizer.decode(ids)
            n = eng.count_tokens(prompt)
            if n >= 48:
                continue
            ref = eng.generate(prompt, max_new_tokens=100, draft="none")
            assert ref.finish_reason in ("cache_full", "stop")
            for mode, k in itertools.product(MODES, (1, 3, 8, None)):
                r = eng.generate(prompt, max_new_tokens=100, draft=mode, k=k)
                assert r.token_ids == ref.token_ids, (free, mode, k)
                assert r.finish_reason == ref.finish_reason
            assert eng.target.length <= eng.max_len


def test_greedy_with_chat_and_stop_strings(engines):
    eng = engines["agree"]
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "def greet(name):"}]
    ref = eng.generate(messages=msgs, max_new_tokens=40, draft="none")
    for mode in MODES:
        assert eng.generate(messages=msgs, max_new_tokens=40, draft=mode).token_ids == ref.token_ids
    if len(ref.text) > 6:
        stop = ref.text[3:6]
        cut = eng.generate(messages=msgs, max_new_tokens=40, draft="none", stop=[stop])
        for mode in MODES:
            r = eng.generate(messages=msgs, max_new_tokens=40, draft=mode, k=4, stop=[stop])
            assert r.text == cut.text and r.finish_reason == "stop"


@pytest.mark.slow
@pytest.mark.parametrize("bundle, mode, tree", [
    ("tiny_bundle_disagree", "model", "off"), ("tiny_cuda_bundle_disagree", "model", "off"),
    ("tiny_bundle_disagree", "model", "on"),  # trees need attention_bias: cpu flavor only (contract v3)
    ("tiny_bundle_disagree", "suffix", "off"), ("tiny_bundle_disagree", "recycle", "off"),
    ("tiny_bundle_disagree", "auto", "off"), ("tiny_pruned_bundle", "model", "off"),
    ("tiny_heads_bundle", "heads", "off"), ("tiny_heads_bundle", "heads", "auto"),
    ("tiny_feature_bundle", "heads", "off")])
def test_sampling_on_tiny_onnx_matches_exact_target_distribution(request, bundle, mode, tree):
    """Draws from the real ONNX models with top_k=3 (27 possible 3-token continuations), compared
    with the exact probabilities computed from the target runner alone (fp32 and cuda flavor). The
    suffix index and the recycle table carry over from draw to draw (same prompt), so they do
    propose; the pruned bundle's draft renormalises q over its kept ids; with tree="on" every round
    verifies the sampled chain plus the draft's runners-up (core/tree.py)."""
    if "cuda" in bundle and not cpu_runs_float16():
        pytest.skip(NO_FP16)
    eng = Engine.open(request.getfixturevalue(bundle), max_len=64)
    if mode == "auto":  # its choice reads measured step costs: pinned, so it drafts on any machine
        freeze(eng.target.times, **{f"s{n}": 0.010 for n in range(1, 17)})
        freeze(eng.draft_runner.times, **{f"s{n}": 0.001 for n in range(1, 17)})
    params = SamplingParams(temperature=1.5, top_k=3)
    prompt = "def add(a, b):"
    exact = exact_target_distribution(eng, prompt, params)
    assert sum(exact.values()) == pytest.approx(1.0)
    n = 1200
    counts: dict = {}
    drafted = trees = 0
    for seed in range(n):
        r = eng.generate(prompt, max_new_tokens=3, temperature=1.5, top_k=3, seed=seed, draft=mode,
                         k=None if mode == "auto" else 2, tree=tree)
        drafted += r.stats.drafted
        trees += r.stats.tree_rounds
        key = tuple(r.token_ids)
        counts[key] = counts.get(key, 0) + 1
    assert drafted > n // 4  # the drafter really proposed
    assert chi2_gof(counts, exact, n) > 1e-3
    assert (trees > n // 2) if tree == "on" else trees == 0


# --- batch arrangements: batched == the batch of one == target alone ---------------------------------
# every drafter a batched engine runs (the table's), at 1 slot and at 3: `grammar` proposes only under a
# request's grammar (the structured-output tests below), `docs` only on an engine with documents (the docs
# tests at the end), `self` and `heads` on bundles exported with them (test_lossless_batch_features.py)
BATCH_MODES = [m for m in modes.NAMES if m not in ("none", "grammar", "docs", "self", "heads")]
BATCH_BUNDLES = {"agree": "tiny_bundle", "disagree": "tiny_bundle_disagree", "llama": "tiny_llama_bundle"}
SLOTS = (1, 3)


@pytest.fixture(scope="module")
def batch_engines(request):
    """A batched engine per fp32 bundle and slot count (1: the batch of one; 3), keyed (name, slots),
    the draft model loaded (its `auto` loads it). The cuda-flavored bundles cannot batch
    (core/runner.py)."""
    out = {(name, n): Engine.open(request.getfixturevalue(fx), parallel=n, draft="auto", max_len=256)
           for name, fx in BATCH_BUNDLES.items() for n in SLOTS}
    yield out
    for be in out.values():
        be.close()


def check_batched_lossless(be, eng, seed: int, n_prompts: int, ks, modes_=BATCH_MODES, form=None,
                           max_new_tokens: int = 40) -> list:
    """Every batched mode, adaptive and with each k: n_prompts requests at once (on 3 slots some join
    as others leave; on 1 they queue) give the tokens, text and finish the serial engine gives with
    that mode, and those are the target alone's; every mode really drafted in the batch. `form(prompt)`:
    the request's fields (default: the prompt as is; a json_schema, a grammar or tools and messages:
    the constrained target alone is the reference). Returns the batched results."""
    rng = np.random.default_rng(seed)
    reqs = [(form or (lambda p: dict(prompt=p)))(random_prompt(eng, rng, int(rng.integers(2, 40))))
            for _ in range(n_prompts)]
    refs = [eng.generate(**r, max_new_tokens=max_new_tokens, draft="none") for r in reqs]
    drafted = dict.fromkeys(modes_, 0)
    out = []
    for mode, k in itertools.chain(((m, None) for m in modes_), itertools.product(modes_, ks)):
        got = generate_all(be, [dict(r, max_new_tokens=max_new_tokens, draft=mode, k=k) for r in reqs])
        for r, ref, g in zip(reqs, refs, got):
            one = eng.generate(**r, max_new_tokens=max_new_tokens, draft=mode, k=k)
            assert g.token_ids == one.token_ids == ref.token_ids, (be.slots, mode, k, r)
            assert g.text == one.text == ref.text and g.finish_reason == one.finish_reason == ref.finish_reason
            drafted[mode] += g.stats.drafted
        # the requests did share rounds (3 slots), or ran one at a time (the batch of one)
        assert max(g.stats.batch_size_mean for g in got) > 1.0 if be.slots > 1 else \
            all(g.stats.batch_size_mean == 1.0 for g in got)
        out += got
    # speculation really ran in every mode, and never in the target alone's
    assert all(n for m, n in drafted.items() if m != "none") and drafted.get("none", 0) == 0, drafted
    return out


@pytest.mark.arm64
@pytest.mark.parametrize("slots", SLOTS)
@pytest.mark.parametrize("name", list(BATCH_BUNDLES))
def test_greedy_batched_equals_batch_of_one_equals_target_alone_quick(engines, batch_engines, name, slots):
    check_batched_lossless(batch_engines[name, slots], engines[name], 30 + SEEDS[name], 4, (1, 3),
                           modes_=[*BATCH_MODES, "none"])


@pytest.mark.slow
@pytest.mark.parametrize("name", list(BATCH_BUNDLES))
def test_greedy_batched_every_drafter_every_k_equals_target_alone(engines, batch_engines, name):
    """Every k on 3 slots (the batch of one is the quick test's: it adds no arrangement every k would)."""
    check_batched_lossless(batch_engines[name, 3], engines[name], 40 + SEEDS[name], 6, range(1, 9))


@pytest.mark.arm64
@pytest.mark.parametrize("fx", ["tiny_bundle", "tiny_bundle_disagree"])
def test_seeded_sampling_batch_of_one_equals_the_serial_engine(request, fx):
    """parallel=1 is the serial engine: a seeded sampled request with a fixed k gets the same tokens on
    both (its RNG drawn in the same order, the drafters proposing the same), request after request as
    what the drafters learn carries over. Trees off: the serial engine's tree="auto" chooses trees by
    measured cost, which draws its RNG in another order (a batch runs chains). The suffix drafter (and
    auto over it) is compared greedy: a batched request looks up its own text and the finished
    requests' in two indexes (batch_drafters.py), the serial engine in one, so once earlier requests
    are indexed the two may propose different (equally lossless) chains, which a sampled request's
    draws follow."""
    path = request.getfixturevalue(fx)
    eng = Engine.open(path, draft="auto", max_len=256)
    be = Engine.open(path, parallel=1, draft="auto", max_len=256)
    prompts = _prompts(eng, 80, 3)
    drafted = 0
    for mode, (i, p) in itertools.product(BATCH_MODES, enumerate(prompts)):
        kw = dict(max_new_tokens=32, temperature=0.9, top_p=0.95, seed=90 + i, draft=mode,
                  k=None if mode == "auto" else 2, tree="off")
        if mode in ("suffix", "auto"):  # (see above; auto also picks its source by measured cost)
            kw.update(temperature=0.0)
        one, b1 = eng.generate(p, **kw), be.generate(p, **kw)
        assert b1.token_ids == one.token_ids and b1.finish_reason == one.finish_reason, (mode, i)
        drafted += b1.stats.drafted
    assert drafted > 100
    be.close()
    eng.close()


# a tool a tiny model's answer calls within 48 tokens (tool_choice="required": the answer is a call)
TOOLS = [{"type": "function", "function": {"name": "valve", "parameters": {
    "type": "object", "properties": {"v": {"type": "integer", "minimum": 1, "maximum": 9}, "on": {"type": "boolean"}},
    "required": ["v", "on"], "additionalProperties": False}}}]
STRUCTURED = {"json_schema": lambda p: dict(prompt=p, json_schema=SCHEMA), "grammar": lambda p: dict(prompt=p, grammar=LARK),
              "tools": lambda p: dict(messages=[{"role": "user", "content": p}], tools=TOOLS, tool_choice="required")}


@pytest.fixture(scope="module")
def tools_engines(request):
    """name -> (a serial engine, {slots: a batched engine}) with room for the tools' system turn (288
    tokens with the tiny tokenizer)."""
    out = {}
    for name in ("agree", "llama"):
        path = request.getfixturevalue(BATCH_BUNDLES[name])
        out[name] = (Engine.open(path, draft="auto", max_len=448),
                     {n: Engine.open(path, parallel=n, draft="auto", max_len=448) for n in SLOTS})
    yield out
    for eng, bes in out.values():
        eng.close()
        for be in bes.values():
            be.close()


@pytest.mark.parametrize("slots", SLOTS)
@pytest.mark.parametrize("kind", list(STRUCTURED))
@pytest.mark.parametrize("name", ["agree", "llama"])
def test_greedy_batched_under_a_grammar_equals_constrained_target_alone(request, engines, batch_engines, name,
                                                                        kind, slots):
    """Structured output in a batch: three constrained requests at once (or queued on the batch of one),
    every batched mode and `grammar` (its forced tokens alone), adaptive and k 1 and 3, give the serial
    engine's tokens with that mode, which are the constrained target alone's; and every mode's proposals
    carry the grammar's forced tokens in front (with_grammar: sources "grammar" and "grammar+<mode>")."""
    if kind == "tools":
        eng, bes = request.getfixturevalue("tools_engines")[name]
        be = bes[slots]
    else:
        eng, be = engines[name], batch_engines[name, slots]
    got = check_batched_lossless(be, eng, 70 + SEEDS[name], 3, (1, 3),
                                 modes_=[*BATCH_MODES, "grammar"], form=STRUCTURED[kind], max_new_tokens=48)
    forced = sum(n for g in got for src, n in g.stats.accepted_by_source.items() if src.startswith("grammar"))
    assert forced > 0, [g.stats.accepted_by_source for g in got]
    if kind == "tools":  # every answer that ended is a call of a listed tool
        ended = [g for g in got if g.finish_reason == "stop"]
        assert ended and all(g.tool_calls[0]["function"]["name"] == "valve" for g in ended)


@pytest.mark.arm64
def test_deterministic_sampling_batched_equals_batch_of_one(tiny_bundle):
    """Deterministic mode's promise, batched: a seeded sampled request replays (it runs without
    drafts, requests.pin_for_determinism) and gets the same tokens in a batch as alone, whatever
    mode it names; greedy requests keep their drafters and equal the target alone."""
    be = Engine.open(tiny_bundle, parallel=3, draft="auto", max_len=256, deterministic=True)
    eng = Engine.open(tiny_bundle, draft="auto", max_len=256, deterministic=True)
    rng = np.random.default_rng(5)
    prompts = [random_prompt(eng, rng, int(rng.integers(2, 30))) for _ in range(4)]
    for mode in BATCH_MODES + ["none", "grammar"]:
        reqs = [dict(prompt=p, max_new_tokens=24, temperature=0.9, top_p=0.95, seed=100 + i, draft=mode)
                for i, p in enumerate(prompts)]
        for r, g in zip(reqs, generate_all(be, reqs)):
            assert g.token_ids == eng.generate(**r).token_ids, (mode, r)
        greedy = [dict(prompt=p, max_new_tokens=24, draft=mode) for p in prompts]
        for r, g in zip(greedy, generate_all(be, greedy)):
            assert g.token_ids == eng.generate(r["prompt"], max_new_tokens=24, draft="none").token_ids, (mode, r)
    be.close()
    eng.close()


@pytest.mark.slow
def test_batched_sampling_with_the_draft_model_matches_exact_target_distribution(tiny_bundle_disagree):
    """Rejection sampling in batched rounds: three requests at a time, each drafting with the draft
    model (its steps batched across them), sampled with its own seed: the tokens are distributed as
    the target's exact distribution (the draft disagrees often, so rejections and residuals run)."""
    be = Engine.open(tiny_bundle_disagree, parallel=3, draft="model", max_len=64)
    eng = Engine.open(tiny_bundle_disagree, draft="none", max_len=64)
    params = SamplingParams(temperature=1.5, top_k=3)
    prompt = "def add(a, b):"
    exact = exact_target_distribution(eng, prompt, params)
    n = 1200
    reqs = [dict(prompt=prompt, max_new_tokens=3, temperature=1.5, top_k=3, seed=s, draft="model", k=2)
            for s in range(n)]
    counts: dict = {}
    drafted = 0
    for r in generate_all(be, reqs):
        drafted += r.stats.drafted
        counts[tuple(r.token_ids)] = counts.get(tuple(r.token_ids), 0) + 1
    assert drafted > n // 4
    assert chi2_gof(counts, exact, n) > 1e-3
    be.close()


# --- the documents as a drafting source (drafters/docs.py) --------------------------------------------
def _docs_engine(eng, bundle, prompts, out, max_len, **gen):
    """An engine over `bundle` with an index of documents holding `eng`'s own answers to `prompts` (so
    the docs drafter, which never reads the requests' text, has something to copy)."""
    return _with_docs(bundle, [p + eng.generate(p, draft="none", **gen).text for p in prompts], out, max_len)


def _with_docs(bundle, texts, out, max_len):
    """An engine over `bundle` with an index of these texts, one document each."""
    from tokenizers import Tokenizer

    from edgespec.docs.answer import tokenizer_sha256
    from edgespec.docs.index import build_index

    docs = out / "docs"
    docs.mkdir()
    for i, t in enumerate(dict.fromkeys(texts)):
        (docs / f"{i}.txt").write_text(t, encoding="utf-8")
    build_index([docs], out / "docs.idx", Tokenizer.from_file(str(bundle / "tokenizer.json")),
                tokenizer_sha256(bundle), max_chars=20000)
    return Engine.open(bundle, max_len=max_len, docs=str(out / "docs.idx"))


def _prompts(eng, seed: int, n: int) -> list[str]:
    """The prompts the lossless checks draw from `seed` (check_greedy_lossless, check_batched_lossless)."""
    rng = np.random.default_rng(seed)
    return [random_prompt(eng, rng, int(rng.integers(2, 40))) for _ in range(n)]


def test_greedy_docs_drafter_equals_target_alone(engines, tiny_bundle, tmp_path):
    """The docs drafter, alone and as a source of auto, every k: the documents hold the target's own
    answers to the check's prompts (check_greedy_lossless draws the same ones from the same seed)."""
    eng, seed = engines["agree"], 60
    prompts = _prompts(eng, seed, 2)
    deng = _docs_engine(eng, tiny_bundle, prompts, tmp_path, 256, max_new_tokens=48)
    check_greedy_lossless(deng, seed, 2, (1, 3, 8), modes=["docs", "auto"])
    r = deng.generate(prompts[0], max_new_tokens=48, draft="docs", k=8)  # a fixed k: proposes at every match
    # it copied the documents: 21 of 48 tokens on x86_64 (the random model's answers differ on other CPUs, and
    # their text does not always encode back to the same tokens, so not all of it copies). A fixed k: an
    # adaptive one follows the measured step costs, which an emulator or a loaded machine changes
    assert r.stats.accepted_by_source.get("docs", 0) >= 8, r.stats
    deng.close()


@pytest.mark.parametrize("slots", SLOTS)
def test_greedy_docs_drafter_batched_equals_target_alone(engines, batch_engines, tiny_bundle, tmp_path, slots):
    """The docs drafter in a batch, alone and as a source of auto, adaptive and k 1 and 3: three requests
    at once (or queued on the batch of one), each drafting from the one index of the documents, give the
    serial docs engine's tokens, which are the target alone's; and they copied the documents. A batched
    engine without documents refuses the mode, saying why."""
    eng, seed = engines["agree"], 61
    deng = _docs_engine(eng, tiny_bundle, _prompts(eng, seed, 3), tmp_path, 256, max_new_tokens=40)
    be = Engine.open(tiny_bundle, parallel=slots, max_len=256, docs=str(tmp_path / "docs.idx"))
    got = check_batched_lossless(be, deng, seed, 3, (1, 3), modes_=["docs", "auto"])
    copied = sum(g.stats.accepted_by_source.get("docs", 0) for g in got)
    assert copied >= 40, [g.stats.accepted_by_source for g in got]
    be.close()
    deng.close()
    with pytest.raises(DraftUnavailable, match="draft='docs' is not possible: the engine has no documents"):
        batch_engines["agree", slots].submit("x", draft="docs")


@pytest.mark.slow
def test_docs_sampling_matches_exact_target_distribution(tiny_bundle_disagree, tmp_path):
    """Sampled with top_k=3 from documents holding sampled answers to the same prompt: the tokens are
    distributed as the target's exact distribution."""
    base = Engine.open(tiny_bundle_disagree, max_len=64, draft="none")
    prompt = "def add(a, b):"
    params = SamplingParams(temperature=1.5, top_k=3)
    exact = exact_target_distribution(base, prompt, params)
    texts = [prompt + base.generate(prompt, max_new_tokens=6, temperature=1.5, top_k=3, seed=s).text for s in range(12)]
    eng = _with_docs(tiny_bundle_disagree, texts, tmp_path, 64)
    n, counts, drafted = 1200, {}, 0
    for seed in range(n):
        r = eng.generate(prompt, max_new_tokens=3, temperature=1.5, top_k=3, seed=seed, draft="docs", k=2)
        drafted += r.stats.drafted
        counts[tuple(r.token_ids)] = counts.get(tuple(r.token_ids), 0) + 1
    assert drafted > n // 4
    assert chi2_gof(counts, exact, n) > 1e-3
