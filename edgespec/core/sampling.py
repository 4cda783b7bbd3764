"""Turning one row of logits into a token: greedy argmax, or temperature / top-k / top-p sampling.

Speculative sampling is only lossless if the target's distribution used to accept or reject a draft
token is exactly the one target-alone decoding samples from. So there is one function, `probs`,
that both paths (and the draft model's proposals) call with the same parameters.

Every function looks only at the first `usable` logits: rows past the tokenizer's vocabulary are
padding (see docs/ARCHITECTURE.md) and must never be chosen.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from ..errors import InvalidRequest
from ..limits import SEED_LIMIT, TOP_K_LIMIT


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy (argmax); top_k 0 means no top-k cut; top_p 1 means no nucleus cut.
    The one check of these four values for every caller (the engine's request options build this;
    the server checks only that JSON gave numbers). The bounds compare without converting: an integer
    too large for a float is refused, not an OverflowError."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None

    def __post_init__(self) -> None:
        t, p, k = self.temperature, self.top_p, self.top_k
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t <= sys.float_info.max:
            raise InvalidRequest(f"temperature must be a number >= 0 (0 = greedy), got {t!r}", param="temperature")
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1:
            raise InvalidRequest(f"top_p must be in (0, 1], got {p!r}", param="top_p")
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= TOP_K_LIMIT:
            raise InvalidRequest(f"top_k must be an integer from 0 (off) to {TOP_K_LIMIT}, got {k!r}", param="top_k")
        s = self.seed
        if s is not None and (isinstance(s, bool) or not isinstance(s, int) or not 0 <= s <= SEED_LIMIT):
            raise InvalidRequest(f"seed must be an integer from 0 to {SEED_LIMIT}, got {s!r}", param="seed")

    @property
    def greedy(self) -> bool:
        """top_k == 1 keeps only the argmax, which is greedy whatever the temperature."""
        return self.temperature == 0 or self.top_k == 1


def make_rng(seed: int | None) -> np.random.Generator:
    return np.random.default_rng(seed)


def greedy_token(row: np.ndarray, usable: int) -> int:
    """Argmax over the usable vocabulary. row: [V] (V >= usable)."""
    return int(np.argmax(row[:usable]))


def greedy_tokens(rows: np.ndarray, usable: int) -> np.ndarray:
    """Argmax of each row. rows: [n, V] -> [n] int64."""
    return np.argmax(rows[:, :usable], axis=1)


# The nucleus is usually small: look for it among the top 64, then 1024 candidates, and sort the
# whole vocabulary (10+ ms at 152k) only when those do not hold top_p of the mass.
_NUCLEUS_TRIES = (64, 1024)


def probs(row: np.ndarray, params: SamplingParams, usable: int) -> np.ndarray:
    """The distribution to sample from after temperature, top-k and top-p.

    row: [V] logits -> [usable] float64 probabilities summing to 1. For greedy params it is one-hot
    on the argmax, so rejection sampling with greedy params reduces to greedy matching."""
    x = np.asarray(row[:usable], dtype=np.float64)
    out = np.zeros(usable, dtype=np.float64)
    if params.greedy:
        out[int(np.argmax(x))] = 1.0
        return out
    k = params.top_k if 0 < params.top_k < usable else usable
    if k < usable:
        keep = np.argpartition(-x, k - 1)[:k]
    else:
        keep = None
    z = x[keep] if keep is not None else x
    z = (z - z.max()) / params.temperature
    e = np.exp(z)
    p = e / e.sum()
    if params.top_p < 1.0:
        p, sub = _nucleus(p, params.top_p)
        keep = sub if keep is None else keep[sub]
    if keep is None:
        return p
    out[keep] = p
    return out


def _nucleus(p: np.ndarray, top_p: float) -> tuple[np.ndarray, np.ndarray]:
    """The smallest set of most likely tokens whose mass reaches top_p, renormalised.

    Returns (probabilities, indices into p). Ties at the boundary are broken by index, so the set is
    a deterministic function of p."""
    n = p.shape[0]
    order = None
    for m in _NUCLEUS_TRIES:
        if m >= n:
            break
        cand = np.argpartition(-p, m - 1)[:m]
        if p[cand].sum() >= top_p:
            order = cand[np.lexsort((cand, -p[cand]))]
            break
    if order is None:
        order = np.lexsort((np.arange(n), -p))
    c = np.cumsum(p[order])
    cut = int(np.searchsorted(c, top_p - 1e-12)) + 1  # first index where the mass reaches top_p
    idx = order[: max(1, min(cut, order.shape[0]))]
    q = p[idx]
    return q / q.sum(), idx


def without(p: np.ndarray, q: np.ndarray | None, x: int) -> np.ndarray:
    """What rejection sampling draws from after rejecting draft token x (unnormalised):
    max(0, p - q), or for a deterministic proposal (q None, one-hot on x) p with x removed. The
    chain's first rejection and each rejected sibling of a tree node use it."""
    if q is None:
        r = p.copy()
        r[x] = 0.0
        return r
    return np.maximum(p - q, 0.0)


def sample(p: np.ndarray, rng: np.random.Generator) -> int:
    """One draw from a probability vector (inverse CDF: one uniform per draw, reproducible)."""
    c = np.cumsum(p)
    u = rng.random() * c[-1]
    i = int(np.searchsorted(c, u, side="right"))
    return min(i, p.shape[0] - 1)


def choose(row: np.ndarray, params: SamplingParams, usable: int, rng: np.random.Generator) -> int:
    """Target-alone decoding: the next token from one logits row."""
    if params.greedy:
        return greedy_token(row, usable)
    return sample(probs(row, params, usable), rng)
