"""Shared by the lossless tests: the greedy check, random prompts, and the exact target distribution
the sampled tests compare against."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from edgespec.core.sampling import probs

MODES = ["model", "ngram", "suffix", "recycle", "auto"]


def random_prompt(eng, rng: np.random.Generator, n_tokens: int) -> str:
    """Text from random token ids (of the usable vocabulary, no special tokens)."""
    ids = rng.integers(3, eng.vocab.usable, size=n_tokens).tolist()
    text = eng.tokenizer.decode(ids)
    return text if text.strip() else "x" + text


def check_greedy_lossless(eng, seed: int, n_prompts: int, ks, modes=MODES, **kw) -> None:
    """Every mode, adaptive and with each k, gives the target-alone tokens, text and finish reason;
    and every mode really drafted (else the check would pass vacuously). The engine is not reset
    between calls: the suffix index and the recycle table fill up as the same prompt repeats. `kw`
    goes to every call (a json_schema or grammar: the constrained target alone is the reference)."""
    rng = np.random.default_rng(seed)
    mismatches = []
    drafted = dict.fromkeys(modes, 0)
    for i in range(n_prompts):
        prompt = random_prompt(eng, rng, int(rng.integers(2, 40)))
        ref = eng.generate(prompt, max_new_tokens=48, draft="none", **kw)
        # one pass per token (a pass that chose EOS emits none)
        assert ref.stats.drafted == 0 and ref.stats.target_passes == len(ref.token_ids) + (ref.finish_reason == "stop")
        for mode, k in itertools.chain(((m, None) for m in modes), itertools.product(modes, ks)):
            r = eng.generate(prompt, max_new_tokens=48, draft=mode, k=k, **kw)
            drafted[mode] += r.stats.drafted
            if r.token_ids != ref.token_ids or r.text != ref.text or r.finish_reason != ref.finish_reason:
                mismatches.append((i, mode, k, ref.token_ids, r.token_ids))
    assert not mismatches, mismatches[:3]
    assert sum(drafted.values()) > 40 * n_prompts  # speculation really ran
    assert all(drafted.values()), drafted  # ... in every mode


def exact_target_distribution(eng, prompt: str, params, depth: int = 3) -> dict[tuple[int, ...], float]:
    """The exact joint probability of every continuation of up to `depth` tokens under target-alone
    sampling with `params` (a sequence ends at EOS, which a result's token_ids do not include),
    computed from the target runner itself. Leaves the engine's caches reset."""
    ids = eng.encode(prompt)
    runner = eng.target
    exact: dict = {}

    def walk(prefix: list[int], p: float) -> None:
        runner.rewind(len(ids) - 1)
        row = runner.step([*ids[-1:], *prefix], len(prefix) + 1)[-1]
        dist = probs(row, params, eng.vocab.usable)
        for t in np.flatnonzero(dist):
            q = p * dist[t]
            if int(t) in eng.vocab.eos_ids or len(prefix) == depth - 1:
                key = tuple(prefix) if int(t) in eng.vocab.eos_ids else (*prefix, int(t))
                exact[key] = exact.get(key, 0.0) + q
            else:
                walk([*prefix, int(t)], q)

    runner.reset()
    runner.step(ids[:-1], 1)
    walk([], 1.0)
    eng.reset_cache()
    return exact


def check_heads_sampling(eng, drafter_cls, monkeypatch, lie: bool, n: int = 1200) -> None:
    """Sampled output with a heads drafter (`--draft heads`, k = 1) matches the target's exact
    distribution; with `lie`, the negative control: the drafter reports a flat q for the same sampled
    tokens (so the target accepts them far too often) and the same chi-square must reject it. The
    caller makes the drafter's proposals ones the target accepts, so the acceptance path really runs."""
    from edgespec.core.proposal import Proposal
    from edgespec.core.sampling import SamplingParams

    from helpers.stats import chi2_gof

    if lie:
        honest = drafter_cls.draft

        def lying(self, ctx, k, params, rng):
            prop = honest(self, ctx, k, params, rng)
            if not prop.tokens or prop.q is None:
                return prop
            return Proposal(prop.tokens, np.full_like(prop.q, 1.0 / prop.q.shape[1]), prop.source, prop.conf)

        monkeypatch.setattr(drafter_cls, "draft", lying)
    exact = exact_target_distribution(eng, "def add(a, b):", SamplingParams(temperature=1.5, top_k=3))
    counts: dict = {}
    accepted = 0
    for seed in range(n):
        r = eng.generate("def add(a, b):", max_new_tokens=3, temperature=1.5, top_k=3, seed=seed, draft="heads", k=1)
        accepted += r.stats.accepted
        counts[tuple(r.token_ids)] = counts.get(tuple(r.token_ids), 0) + 1
    assert accepted > n // 2  # the acceptance path really ran
    p = chi2_gof(counts, exact, n)
    assert (p < 1e-6) if lie else (p > 1e-3)


def flip_margin(eng, prompt_ids: list[int], spoken: str, alone: str) -> tuple[int, float]:
    """Where a speculative answer (`spoken`) first leaves the target-alone answer (`alone`) of the same
    prompt: (token position, how far the target alone prefers its own token there, in logits).

    Both texts are encoded again (the server returns text), so the position is in those tokens. A
    verify step that scores k+1 positions at once may round a near-tie the other way than one step
    does (int8 activations, docs/graph-contract.md); the margin says whether that is all that
    happened: a speculative bug makes tokens the target does not nearly prefer. (-1, 0.0): the same."""
    a = eng.tokenizer.encode(spoken, add_special_tokens=False).ids
    b = eng.tokenizer.encode(alone, add_special_tokens=False).ids
    i = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if i is None:
        return -1, 0.0
    eng.reset_cache()  # the target's cache holds nothing the step below would skip
    logits = eng.target.step(prompt_ids + b[:i], 1)[0]
    eng.reset_cache()
    return i, float(logits[b[i]] - logits[a[i]])
