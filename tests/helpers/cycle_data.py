"""Teacher-forced heads training data of a repeating token cycle, for the Medusa and feature drafters'
learning tests (the exporter's `Collected`, so both train through their real loops)."""
from __future__ import annotations

import numpy as np


def cycle_data(T=600, H=32, N=16, cycle=(3, 7, 1, 9, 12), seed=0):
    """Row t holds token x_t (`ids`); its hidden state picks x_{t+1} through the lm_head `emb` [N, H]
    (h_t = 4 * emb[x_{t+1}] plus noise) and its target distribution is x_{t+1}; 6 documents, the last
    held out. Returns (Collected, emb)."""
    from edgespec_export.heads_data import Collected

    rng = np.random.default_rng(seed)
    emb = rng.standard_normal((N, H)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    x = np.array([cycle[t % len(cycle)] for t in range(T + 1)])
    hidden = (4.0 * emb[x[1:]] + 0.1 * rng.standard_normal((T, H))).astype(np.float32)
    top_ids = np.zeros((T, 4), dtype=np.int64)
    top_ids[:, 0] = x[1:]
    top_p = np.zeros((T, 4), dtype=np.float32)
    top_p[:, 0] = 1.0
    doc = (np.arange(T) // (T // 6)).astype(np.int32)
    return Collected(hidden, x[1:].copy(), top_ids, top_p, doc, doc == 5, x[:T].copy()), emb
