"""Which layers the self-draft skips: a measured search on a calibration text, at export.

SWIFT-like, in two phases, every candidate scored by what it would buy rather than by agreement alone:
1. screen: skip each layer 1..L-1 alone and measure the draft's greedy top-1 agreement with the
   full target over the calibration text (teacher-forced, one pass per candidate);
2. grow: add layers in the screen's order (least harmful first), measuring each set, and keep the
   set with the highest expected speed-up, stopping after PATIENCE sets in a row that did not
   improve it (or at the evaluation budget).
The documented default (drafters/self.py, default_skip) is measured too and wins if it scores higher.

Expected speed-up of a skip set with agreement a and cost ratio c (the draft step's weight bytes
over the target's: a decode step is bandwidth-bound, and a byte count does not depend on what else
the export machine runs):  max over k of E[tokens](k, a) / (k c + verify(k + 1)), with verify the
cost model's prior ratios (costmodel.PRIOR_VERIFY_RATIO). The runtime re-measures all of it; this
only picks the set.

The agreement is measured teacher-forced: the draft reads its own K/V for earlier positions, where at
run time it reads the target's exact ones, so the runtime's acceptance is usually a little higher.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from edgespec.core.costmodel import _prior_ratio, expected_tokens
from edgespec.models.manifest import ModelFacts

CALIBRATION_TOKENS = 192
PATIENCE = 3
K_MAX = 8


def expected_speedup(a: float, c: float) -> tuple[float, int]:
    """(best expected speed-up over the target alone, its k) for acceptance a and cost ratio c."""
    best, best_k = 1.0, 0
    for k in range(1, K_MAX + 1):
        s = expected_tokens(k, a) / (k * c + _prior_ratio(k + 1))
        if s > best:
            best, best_k = s, k
    return best, best_k


def _graph_bytes(proto, weights) -> int:
    """Weight bytes a one-token step reads: every initializer but the embedding table (one row of a
    Gather) unless it is also the lm_head's (tied)."""
    gathered = {n.input[0] for n in proto.graph.node if n.op_type in ("Gather", "GatherBlockQuantized")}
    matmul_read = {x for n in proto.graph.node if n.op_type not in ("Gather", "GatherBlockQuantized") for x in n.input}
    return sum(weights.arrays[t.name].nbytes for t in proto.graph.initializer
               if t.name not in gathered or t.name in matmul_read)


def max_evaluations(layers: int, max_evals: int | None = None) -> int:
    """At most how many skip sets search_skip measures (its progress bar's total): every skippable
    layer alone, then one set per layer added greedily (the first is the best single: cached), within
    the budget; a search that stops early for lack of progress measures fewer."""
    budget = max_evals if max_evals is not None else min(80, 2 * layers + 8)
    return max(layers - 1, min(budget, 2 * layers - 4)) if layers >= 2 else 0


def search_skip(model_path: Path, facts: ModelFacts, ids: Sequence[int], usable: int, *,
                tokens: int = CALIBRATION_TOKENS, max_evals: int | None = None, progress=None) -> dict:
    """The manifest's `self_draft` record for the target graph at `model_path`."""
    import onnxruntime as ort

    from edgespec.core.runner import ModelRunner
    from edgespec.core.shared_weights import SharedWeights
    from edgespec.drafters.self import default_skip
    from edgespec.edge.providers import session_options, shared_pool_active
    from edgespec.models.layer_skip import skip_layers

    weights = SharedWeights(model_path)
    ids = [int(i) for i in ids[:tokens]]
    L = facts.layers
    if len(ids) < 8 or L < 2:
        return {"skip": default_skip(L) if L >= 2 else [], "method": "default (no calibration text)"}

    def session(model, names=None):
        # on the process-wide pool if one exists (an export run inside an engine's process: tests)
        so = session_options(None, shared_threads=shared_pool_active())
        weights.configure(so, names, folder=model_path.parent)
        return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])

    target = ModelRunner(session(weights.proto.SerializeToString()), facts, len(ids) + 1).slot(0)
    ref = np.argmax(target.step(ids, len(ids))[:, :usable], axis=1)  # [N]: the target's next tokens
    full_bytes = _graph_bytes(weights.proto, weights)
    cache: dict[tuple[int, ...], dict] = {}
    budget = max_evals if max_evals is not None else min(80, 2 * L + 8)

    def score(skip: Sequence[int]) -> dict:
        key = tuple(sorted(skip))
        if key in cache:
            return cache[key]
        proto = skip_layers(weights.proto, key, L)
        sess = session(proto.SerializeToString(), [t.name for t in proto.graph.initializer])
        kept = [i for i in range(L) if i not in key]
        r = target.skip(sess, kept)  # teacher-forced: writes its own rows 0..N-1
        got = np.argmax(r.step(ids, len(ids))[:, :usable], axis=1)
        a = float(np.mean(got[:-1] == ref[:-1]))
        c = _graph_bytes(proto, weights) / full_bytes
        s, k = expected_speedup(a, c)
        cache[key] = {"skip": list(key), "acceptance": round(a, 4), "cost_ratio": round(c, 4),
                      "expected_speedup": round(s, 4), "k": k}
        if progress is not None:
            progress.update(1)
        return cache[key]

    single = {i: score([i])["acceptance"] for i in range(1, L)}
    order = sorted(single, key=lambda i: (-single[i], i))
    best: dict | None = None
    cur: list[int] = []
    misses = 0
    for i in order:
        if len(cache) >= budget or len(cur) + 1 >= L - 1:
            break
        cur = cur + [i]
        rec = score(cur)
        if best is None or rec["expected_speedup"] > best["expected_speedup"]:
            best, misses = rec, 0
        else:
            misses += 1
            if misses >= PATIENCE:
                break
    dflt = score(default_skip(L))
    if best is None or dflt["expected_speedup"] > best["expected_speedup"]:
        best = dflt
    out = dict(best)
    out.update(method="screen+greedy (export/edgespec_export/self_search.py)", calibration_tokens=len(ids),
               evaluations=len(cache), default=dflt)
    return out
