"""The greedy lossless check, shared by test_lossless.py and test_draft_vocab.py."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

MODES = ["model", "ngram", "suffix", "recycle", "auto"]


def random_prompt(eng, rng: np.random.Generator, n_tokens: int) -> str:
    """Text from random token ids (of the usable vocabulary, no special tokens)."""
    ids = rng.integers(3, eng.usable, size=n_tokens).tolist()
    text = eng.tokenizer.decode(ids)
    return text if text.strip() else "x" + text


def check_greedy_lossless(eng, seed: int, n_prompts: int, ks, modes=MODES) -> None:
    """Every mode, adaptive and with each k, gives the target-alone tokens, text and finish reason;
    and every mode really drafted (else the check would pass vacuously). The engine is not reset
    between calls: the suffix index and the recycle table fill up as the same prompt repeats."""
    rng = np.random.default_rng(seed)
    mismatches = []
    drafted = dict.fromkeys(modes, 0)
    for i in range(n_prompts):
        prompt = random_prompt(eng, rng, int(rng.integers(2, 40)))
        ref = eng.generate(prompt, max_new_tokens=48, draft="none")
        assert ref.stats.drafted == 0 and ref.stats.tokens_per_pass == pytest.approx(1.0)
        for mode, k in itertools.chain(((m, None) for m in modes), itertools.product(modes, ks)):
            r = eng.generate(prompt, max_new_tokens=48, draft=mode, k=k)
            drafted[mode] += r.stats.drafted
            if r.token_ids != ref.token_ids or r.text != ref.text or r.finish_reason != ref.finish_reason:
                mismatches.append((i, mode, k, ref.token_ids, r.token_ids))
    assert not mismatches, mismatches[:3]
    assert sum(drafted.values()) > 40 * n_prompts  # speculation really ran
    assert all(drafted.values()), drafted  # ... in every mode
