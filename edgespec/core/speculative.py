"""The acceptance of one sequence's speculative round: propose k -> verify k+1 in one target pass ->
accept -> rewind. engine/round.py runs rounds (for a batch of sequences, one sequence being the batch
of one) and decides each row with the accept functions here.

State between rounds (the invariant every function here keeps):
    ctx      every token so far (prompt + output); ctx[-1] is the newest, not yet fed to the target
    target   its cache holds exactly ctx[:-1]          (target.length == len(ctx) - 1)
    drafter  its cache (if any) holds a prefix of ctx  (it feeds what it lacks when it proposes)

A round with no proposals is a plain target step, so target-alone decoding runs through this same
code and consumes the random stream the same way: k = 0 *is* the baseline.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .proposal import Proposal
from .sampling import SamplingParams, greedy_tokens, probs, sample, without


@dataclass
class Round:
    tokens: list[int]  # new tokens: the accepted proposals, then the target's own token
    drafted: int
    accepted: int
    source: str
    tree_shape: str = ""  # nodes per depth of a verified tree ("" for a chain), see core/tree.py
    tree_nodes: int = 0  # tree nodes verified, root included (0 for a chain)


def usable_draft(prop: Proposal, k: int, usable: int) -> list[int]:
    """The proposal's first k tokens, cut at the first id past the usable vocabulary (never accepted)."""
    draft = prop.tokens[:k]
    for i, t in enumerate(draft):
        if not 0 <= t < usable:
            return draft[:i]
    return draft


def accept_greedy(rows: np.ndarray, draft: list[int], usable: int) -> tuple[int, int]:
    """The longest prefix of draft that matches the target's argmax, and the target's next token.
    rows: [len(draft)+1, V]; row i is the target's prediction after draft[:i]."""
    best = greedy_tokens(rows, usable)
    n = 0
    while n < len(draft) and draft[n] == best[n]:
        n += 1
    return n, int(best[n])


def accept_sampled(rows: np.ndarray, prop: Proposal, draft: list[int], params: SamplingParams,
                   rng: np.random.Generator, usable: int) -> tuple[int, int]:
    """Rejection sampling: accept draft token x with probability min(1, p(x)/q(x)); at the first
    rejection sample from normalize(max(0, p - q)); if all are accepted sample a bonus token from p.
    For deterministic proposals q is one-hot on x, so acceptance is p(x) and the residual is p with
    x removed. The tokens this yields are distributed exactly as the target's own samples."""
    for i, x in enumerate(draft):
        p = probs(rows[i], params, usable)
        q = prop.q[i] if prop.q is not None else None
        qx = 1.0 if q is None else float(q[x])
        if rng.random() * qx < p[x]:
            continue
        resid = without(p, q, x)
        if resid.sum() <= 0.0:  # only when p == q up to rounding, where rejection cannot happen
            resid = p
        return i, sample(resid, rng)
    return len(draft), sample(probs(rows[len(draft)], params, usable), rng)
