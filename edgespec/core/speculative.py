"""The acceptance of one sequence's speculative round: propose k -> verify k+1 in one target pass ->
accept -> rewind. engine/round.py runs rounds (for a batch of sequences, one sequence being the batch
of one) and decides each row with the one `accept` here (under a grammar, on masked rows).

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

from .constraint import Constraint
from .proposal import Proposal
from .sampling import SamplingParams, choose, greedy_token, probs, sample, without


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


def first_token(row: np.ndarray, params: SamplingParams, usable: int, rng: np.random.Generator,
                constraint: Constraint | None = None) -> int:
    """The token after the prompt (from the prefill's last row), masked and advanced under a constraint."""
    if constraint is None:
        return choose(row, params, usable, rng)
    t = choose(constraint.mask(row), params, usable, rng)
    constraint.advance([t])
    return t


def grammar_draft(prop: Proposal, draft: list[int], constraint: Constraint) -> tuple[list[int], np.ndarray | None]:
    """The draft cut at its first token the grammar forbids, and that token's draft distribution
    (None for a deterministic proposal or no cut). A sampled draft token the grammar forbids has
    p = 0, so rejection sampling would reject it and draw from max(0, p - q): the caller draws from
    that residual at the cut, which keeps the output distributed as the masked target's."""
    n = constraint.check(draft)
    if n >= len(draft):
        return draft, None
    q = prop.q[n] if prop.q is not None and n < len(prop.q) else None
    return draft[:n], q


def accept(rows: np.ndarray, prop: Proposal, draft: list[int], params: SamplingParams, rng: np.random.Generator,
           usable: int, constraint: Constraint | None = None, cut_q: np.ndarray | None = None) -> tuple[int, int]:
    """The round's decision: (proposals accepted, the target's next token). rows: [len(draft)+1, V];
    row i is the target's prediction after draft[:i], decided in order until one is not accepted.

    Greedy: a proposal is accepted while it is the row's argmax; the next token is the argmax of
    the first row that disagrees (or of the last row). Sampled (rejection sampling): draft token x is
    accepted with probability min(1, p(x)/q(x)); at the first rejection the next token is drawn from
    normalize(max(0, p - q)), after all of them from p. For deterministic proposals q is one-hot on
    x, so acceptance is p(x) and the residual is p with x removed. The tokens this yields are
    distributed exactly as the target's own samples.

    Under a grammar (`constraint`) the same decisions run on masked rows: row i masked by the
    grammar state after draft[:i], the state advancing through each accepted token and the next
    one, so each decision sees exactly what target-alone decoding under the grammar would sample
    from. cut_q: the draft distribution of a proposal's token the grammar forbade right after the
    draft (grammar_draft): rejected, as p(x) = 0, so the last row draws from max(0, p - cut_q)."""
    n = len(draft)
    for i in range(n + 1):
        row = rows[i] if constraint is None else constraint.mask(rows[i])
        if params.greedy:
            t = greedy_token(row, usable)
            if i < n and draft[i] == t:
                if constraint is not None:
                    constraint.advance([t])
                continue
        else:
            p = probs(row, params, usable)
            if i < n:
                x = draft[i]
                q = prop.q[i] if prop.q is not None else None
                qx = 1.0 if q is None else float(q[x])
                if rng.random() * qx < p[x]:
                    if constraint is not None:
                        constraint.advance([x])
                    continue
                resid = without(p, q, x)
            elif cut_q is not None:
                resid = np.maximum(p - cut_q, 0.0)
            else:
                resid = p
            if resid.sum() <= 0.0:  # only when p == q up to rounding, where rejection cannot happen
                resid = p
            t = sample(resid, rng)
        if constraint is not None:
            constraint.advance([t])
        return i, t
    raise AssertionError("unreachable: the last row always decides")
