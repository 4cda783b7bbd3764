"""The feature drafter (`--draft heads` on a bundle exported with `--heads feature`).

An EAGLE-style one-layer block (export/edgespec_export/feature.py) over the target's own final
hidden state: from f, the hidden_states row at the position of the context's second-to-last token
(the state whose logits chose the last token x), one graph call gives the feature f^ at x's
position and logits for the token after x; the chain continues over its own features:
f^' = block(f^, e(x^)). No KV cache of its own, so no catch-up and nothing to rewind, like the
Medusa heads (heads.py, whose acceptance bookkeeping and chain sizing it shares).

Each call costs one draft step (measured, a few % of a target step), so the chain is grown while
another token is expected to pay for its call and its verify row (myopically: the next position's
running acceptance), then trimmed to the length with the most expected tokens per second.
Sampling picks each token from its own q (drafters/model.pick), the next call conditioned on it:
the chain of q's rejection sampling needs.
"""
from __future__ import annotations

import time

import numpy as np

from ..core.proposal import EMPTY, Proposal
from ..core.sampling import SamplingParams
from .heads import HEADS_INPUT, ChainHeads
from .model import pick

FEATURE_TOKEN = "token"  # the graph's inputs: hidden float32 [1, H], token int64 [1] (kept index, N = UNK)
FEATURE_OUTPUT = "feature"  # its outputs: feature float32 [1, H], logits float32 [1, N]


class FeatureDrafter(ChainHeads):
    """See the module docstring; n_heads is the longest chain (the export's training depth)."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        # token id -> kept row index; the UNK row (index N) for an id outside the kept vocabulary
        self.index = np.full(self.usable, self.scored, dtype=np.int64)
        self.index[self.vocab_map] = np.arange(self.scored)
        self._out = [o.name for o in self.session.get_outputs()]

    def draft_cost(self, n: int) -> float:
        return n * self.costs.draft_step()  # one graph call per drafted token

    def warmup(self) -> None:
        """Times the graph three times, so the cost model starts from this device's cost."""
        f = np.zeros((1, self.session.get_inputs()[0].shape[1]), dtype=np.float32)
        for _ in range(3):
            self._run(f, self.scored)

    def _run(self, f: np.ndarray, x: int) -> tuple[np.ndarray, np.ndarray]:
        """One block call: (f^ [1, H], logits [N]) from f [1, H] and x's kept index."""
        t0 = time.perf_counter()
        out = dict(zip(self._out, self.session.run(None, {HEADS_INPUT: f, FEATURE_TOKEN: np.array([x], np.int64)})))
        self.times.add(1, time.perf_counter() - t0)
        return out[FEATURE_OUTPUT], out["logits"][0]

    def _another_pays(self, confs: list[float]) -> bool:
        """Whether one more call is expected to beat the best chain drafted so far in tokens per
        second (the next position's running acceptance standing in for its unknown confidence)."""
        j = len(confs)
        if j >= self.n_heads:
            return False
        e, p_all = self._expected(confs)
        _, best = self._best_rate(confs)
        return (e[j] + p_all * self.mean[j].mean) / (self.draft_cost(j + 1) + self.costs.verify(j + 2)) > best

    def draft(self, ctx, k, params: SamplingParams, rng) -> Proposal:
        p = len(ctx) - 2
        f = self.target.hidden_row(p, ctx[p]) if k > 0 and p >= 0 else None
        if f is None:  # the target's last step did not compute this position (a tree round): skip one round
            return EMPTY
        f, x = f.reshape(1, -1).astype(np.float32, copy=False), int(self.index[ctx[-1]])
        tokens, confs, qs = [], [], []
        for _ in range(min(k, self.n_heads)):
            f, row = self._run(f, x)
            self.last_sizes.append(1)
            t, c, q, x = pick(row, params, rng, self.scored, self.usable, self.vocab_map)
            tokens.append(t)
            confs.append(c)
            if q is not None:
                qs.append(q)
            if self.adaptive and not self._another_pays(confs):
                break
        if self.adaptive and tokens:
            n = self._best_length(confs)
            del tokens[n:], confs[n:], qs[n:]
        return self._proposal(tokens, confs, qs)
