"""Speculation under a grammar on fake models: the sampled output is distributed as the masked target's
(chi-square, with a negative control that breaks the rule for a forbidden draft token), greedy equals
the masked target alone, and the llguidance-backed constraint keeps its state through checks and
look-aheads."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from edgespec.core.proposal import Proposal
from edgespec.core.runner import StepTimes
from edgespec.core.sampling import SamplingParams, probs
from edgespec.core.speculative import first_token
from helpers.rounds import speculative_round
from edgespec.drafters.grammar import GrammarDrafter, WithGrammar
from edgespec.drafters.model import ModelDrafter

from helpers.stats import chi2_gof

V = 5
# ALLOWED[last]: the tokens the fake grammar allows after `last`; after 4 only 0 (a forced token)
ALLOWED = np.array([[1, 1, 0, 1, 0], [0, 1, 1, 0, 1], [1, 0, 1, 1, 0], [1, 1, 0, 0, 1], [1, 0, 0, 0, 0]], bool)


class FakeGrammar:
    """The Constraint protocol over ALLOWED: the next token depends on the last one."""

    def __init__(self, last: int):
        self.start = last
        self.toks: list[int] = []
        self.consumed = 0
        self.forced_count = 0

    def _last(self, extra=()):
        seq = [self.start, *self.toks, *extra]
        return seq[-1]

    def mask(self, row):
        out = np.array(row, dtype=np.float32, copy=True)
        out[:V][~ALLOWED[self._last()]] = -np.inf
        out[V:] = -np.inf
        return out

    def check(self, tokens):
        last = self._last()
        for i, t in enumerate(tokens):
            if not ALLOWED[last, t]:
                return i
            last = t
        return len(tokens)

    def advance(self, tokens):
        assert self.check(tokens) == len(tokens), tokens
        self.toks += list(tokens)
        self.consumed += len(tokens)

    def rollback(self, n):
        del self.toks[len(self.toks) - n:]
        self.consumed -= n

    def forced(self, after=()):
        if self.check(after) < len(after):
            return []
        out, last = [], self._last(after)
        while ALLOWED[last].sum() == 1 and len(out) < 4:
            last = int(np.flatnonzero(ALLOWED[last])[0])
            out.append(last)
        return out


class FakeRunner:
    def __init__(self, table):
        self.table = table  # [V, V, V+2]: logits after (second-last, last); two padding rows
        self.vocab_size = table.shape[-1]
        self.max_len = 64
        self.tokens: list[int] = []
        self.times = StepTimes()

    @property
    def length(self):
        return len(self.tokens)

    def logits_after(self, ctx):
        return self.table[ctx[-2] if len(ctx) >= 2 else 0, ctx[-1]]

    def step(self, tokens, n_logits=1):
        self.tokens.extend(int(t) for t in tokens)
        self.times.add(len(tokens), 0.01)
        n = len(self.tokens)
        return np.stack([self.logits_after(self.tokens[: n - n_logits + 1 + i]) for i in range(n_logits)])

    def rewind(self, length):
        del self.tokens[length:]

    def reset(self):
        self.tokens.clear()


def _tables(seed=0):
    rng = np.random.default_rng(seed)
    t = rng.normal(size=(V, V, V + 2)) * 1.5
    t[..., V:] = 50.0
    d = rng.normal(size=t.shape) * 1.5  # a draft that disagrees: many of its tokens are forbidden
    d[..., V:] = 50.0
    return t, d


PROMPT = [1, 3]


def _exact(table, params, n_tokens):
    """The exact joint of n_tokens under masked target-alone sampling."""
    runner = FakeRunner(table)
    out = {}
    for seq in itertools.product(range(V), repeat=n_tokens):
        ctx, p, g = list(PROMPT), 1.0, FakeGrammar(PROMPT[-1])
        for t in seq:
            p *= probs(g.mask(runner.logits_after(ctx)), params, V)[t]
            if p == 0:
                break
            ctx.append(t)
            g.advance([t])
        if p > 0:
            out[seq] = p
    return out


def _draws(t_table, d_table, params, kind, n, seed, n_tokens=3, k=3):
    rng = np.random.default_rng(seed)
    target, draft = FakeRunner(t_table), FakeRunner(d_table)
    counts: dict = {}
    drafted = cut = 0
    for _ in range(n):
        target.reset()
        g = FakeGrammar(PROMPT[-1])
        ctx = PROMPT + [first_token(target.step(PROMPT, 1)[0], params, V, rng, g)]
        drafter = ModelDrafter(draft, V, adaptive=False)
        if kind == "forced+model":
            drafter = WithGrammar(drafter, GrammarDrafter(None, g))
        drafter.begin(ctx[:-1])
        while len(ctx) < len(PROMPT) + n_tokens:
            r = speculative_round(target, drafter, ctx, k, params, rng, V, g)
            ctx.extend(r.tokens)
            drafted += r.drafted
            assert g.consumed == len(ctx) - len(PROMPT)  # the grammar state is the accepted text's
        seq = tuple(ctx[len(PROMPT): len(PROMPT) + n_tokens])
        counts[seq] = counts.get(seq, 0) + 1
    return counts, drafted


PARAMS = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.8, top_k=3)]


@pytest.mark.parametrize("kind", ["model", "forced+model"])
@pytest.mark.parametrize("pi", [0, 1], ids=["t1", "t0.8-k3"])
def test_sampled_speculation_under_a_grammar_follows_the_masked_target(kind, pi):
    t, d = _tables()
    n = 4000
    counts, drafted = _draws(t, d, PARAMS[pi], kind, n, seed=40 + pi)
    assert drafted > n // 2  # the draft really proposed
    assert all(ALLOWED[a, b] for seq in counts for a, b in zip((PROMPT[-1], *seq), seq))  # nothing forbidden
    assert chi2_gof(counts, _exact(t, PARAMS[pi], 3), n) > 1e-3


def test_the_masked_chi_square_check_can_fail(monkeypatch):
    """Negative control: drawing from the target's own distribution where the grammar cut a sampled
    draft (instead of the residual max(0, p - q) rejection sampling owes it) skews the output, and
    the harness above sees it."""
    import edgespec.core.speculative as spec

    real = spec.grammar_draft
    monkeypatch.setattr(spec, "grammar_draft", lambda prop, draft, c: (real(prop, draft, c)[0], None))
    t, d = _tables()
    counts, _ = _draws(t, d, PARAMS[0], "model", 4000, seed=7)
    assert chi2_gof(counts, _exact(t, PARAMS[0], 3), 4000) < 1e-6


def test_greedy_under_a_grammar_equals_the_masked_target_alone():
    t, d = _tables(3)
    params = SamplingParams()
    rng = np.random.default_rng(0)
    for kind in ("model", "forced+model"):
        target = FakeRunner(t)
        g = FakeGrammar(PROMPT[-1])
        ctx = PROMPT + [first_token(target.step(PROMPT, 1)[0], params, V, rng, g)]
        drafter = ModelDrafter(FakeRunner(d), V, adaptive=False)
        if kind == "forced+model":
            drafter = WithGrammar(drafter, GrammarDrafter(None, g))
        drafter.begin(ctx[:-1])
        while len(ctx) < 24:
            ctx.extend(speculative_round(target, drafter, ctx, 4, params, rng, V, g).tokens)
        ref, ref_g = list(PROMPT), FakeGrammar(PROMPT[-1])
        while len(ref) < 24:
            tok = int(np.argmax(ref_g.mask(FakeRunner(t).logits_after(ref))[:V]))
            ref.append(tok)
            ref_g.advance([tok])
        assert ctx[:24] == ref, kind


def test_forced_tokens_are_proposed_and_accepted():
    """After token 4 the fake grammar forces 0: the grammar drafter proposes it, nothing else."""
    g = FakeGrammar(4)
    gd = GrammarDrafter(None, g)
    gd.begin([1, 4])
    assert gd.propose([1, 4], 3, None, None).tokens == [0]
    assert gd.propose([1, 4, 0], 3, None, None).tokens == []  # ahead of the state: looked up, not consumed
    assert g.consumed == 0 and g.toks == []


# --- the llguidance-backed constraint on a real tokenizer --------------------------------------------
@pytest.fixture(scope="module")
def grammars(tiny_bundle):
    from edgespec.engine import Engine

    eng = Engine.open(tiny_bundle, max_len=64, warmup=False, verify=False)
    yield eng.vocab.grammars, eng.tokenizer
    eng.close()


def test_llguidance_constraint_checks_without_consuming_and_looks_ahead(grammars):
    from edgespec.core.constraint import Grammar

    gs, tok = grammars
    c = gs.compile(Grammar("lark", 'start: "level " /[0-9]{1,3}/ " ok"', "grammar"))
    forced = c.forced()
    assert tok.decode(forced).startswith("level")  # the literal is forced
    good = tok.encode("level 42 ok", add_special_tokens=False).ids
    assert c.check(good) == len(good) and c.consumed == 0
    bad = tok.encode("level x", add_special_tokens=False).ids
    assert c.check(bad) < len(bad)
    c.advance(good[:2])
    assert c.consumed == 2 and c.check(good[2:]) == len(good) - 2
    c.rollback(2)
    assert c.consumed == 0 and c.forced() == forced
    row = np.zeros(gs.n_vocab, dtype=np.float32)
    masked = c.mask(row)
    assert np.isfinite(masked).sum() >= 1 and np.isfinite(masked[forced[0]])
    assert not np.isfinite(masked[bad[-1]]) or bad[-1] == forced[0]


@pytest.mark.parametrize("kind, text, words", [
    ("json_schema", '{"type": "strin"}', "refused by the grammar compiler"),
    ("json_schema", "{not json", "not valid"),
    ("lark", "start: nope", "refused by the grammar compiler"),
    ("lark", "x" * (300 * 1024), "at most"),
])
def test_a_refused_grammar_is_one_invalid_request_naming_it(grammars, kind, text, words):
    from edgespec.core.constraint import Grammar
    from edgespec.errors import InvalidRequest

    gs, _ = grammars
    with pytest.raises(InvalidRequest) as e:
        gs.compile(Grammar(kind, text, "the_field"))
    assert e.value.param == "the_field" and words in str(e.value)


def test_a_byte_level_vocabulary_with_a_sentencepiece_style_decoder_still_reaches_a_space(grammars):
    """The GGUF converter writes SmolLM2's byte-level tokenizer with a decoder sequence (ByteFallback,
    Fuse, Replace, ByteLevel); read as it is, llguidance saw every 'Ġ' as a literal and the ': ' JSON
    forces after a key could not be produced (a real SmolLM2 bundle failed every json_schema request)."""
    import json as _json

    from tokenizers import Tokenizer

    from edgespec.core.constraint import Grammar, Grammars, library_view

    gs, tok = grammars
    d = _json.loads(tok.to_str())
    pre = d["pre_tokenizer"]
    assert "ByteLevel" in {x["type"] for x in pre.get("pretokenizers", [pre])}  # the byte-level vocabulary the fix reads
    d["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}]}
    odd = Tokenizer.from_str(_json.dumps(d))
    c = Grammars(odd, gs.n_vocab, gs.eos_ids).compile(Grammar("lark", 'start: "a b"', "grammar"))
    space_and_b = tok.encode("a b", add_special_tokens=False).ids
    assert c.check(space_and_b) == len(space_and_b)  # "a b" as the tokenizer writes it is allowed
    assert _json.loads(library_view(odd.to_str()))["decoder"]["type"] == "ByteLevel"
