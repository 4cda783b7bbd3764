"""The feature drafter trained at export (`edgespec export ... --heads feature`): one EAGLE-style
block over the target's own final hidden state, autoregressive over its own features.

    f^_{t+1} = block(f_t, e(x_{t+1}))        f_t: the target's hidden_states row at position t (the
                                             normed state its lm_head reads); x_{t+1}: the token after
                                             it (the one f_t's logits chose, accepted)
    block:   z  = f W_f + e(x) W_e + b       e(x): the target's kept lm_head row of x (Qwen ties it
                                             to the embedding; any fixed code per token would do,
                                             since W_e is trained), a learned UNK row for the rest
             z  = z + W_d (SiLU(W_g rms(z)) * W_u rms(z))        (SwiGLU, intermediate size I)
             f^ = rms(z) * g                 g learned: the target's normed scale
    logits = f^ @ E_kept^T                   the target's own kept lm_head rows, frozen
    k > 1:   f^_{t+2} = block(f^_{t+1}, e(x^_{t+2})), x^ the token drafted from f^_{t+1}

No attention across positions (EAGLE-1 has one decoder layer): the target's f_t has already
attended over the whole prefix, and a drafter without a KV cache of its own has no catch-up to pay
after other sources' rounds and nothing to rewind after a rejection; one call is two H x H and three
H x I products plus the pruned lm_head, a few % of a target step. EAGLE's attention layer is the
next step if measured acceptance says the chain's later positions need it.

In the graph, e(x) W_e + b is folded into one table T [N + 1, H] (row N: UNK), so a call reads one
row of it instead of multiplying: z = f W_f + T[x]. Block matrices are float32 (a 1.5B target's:
~47 MB with I = H); the lm_head rows are the target's as stored (heads_graph.lm_head_nodes).

Training (torch, CPU, the export's child process): unrolled over n steps from each position t;
step j feeds the previous step's predicted feature (the true f_t at j = 0) and the TRUE token
x_{t+1+j}, and is scored against the target's row t + 1 + j: soft cross-entropy over its top 16
(as the Medusa heads) + REG_WEIGHT * smooth-L1(f^, f_{t+1+j}) (EAGLE's feature regression), weight
0.8^j; no step crosses a document's end. Held-out top-1 is measured per chain position twice: with
the true tokens as inputs, and with the model's own argmax tokens (what the runtime sees).
"""
from __future__ import annotations

import math

import numpy as np

from . import fit
from .heads_graph import EPS

REG_WEIGHT = 1.0  # the feature regression's weight beside the soft cross-entropy
STEP_DECAY = 0.8  # loss weight of chain step j: 0.8^j
PARAMS = ("w_f", "table", "w_g", "w_u", "w_d", "g")  # the graph's weights, feature_step's arguments


def chain_rows(doc: np.ndarray, n: int) -> np.ndarray:
    """[T, n]: row t + 1 + j of the same document for step j from position t, -1 past its end."""
    T = doc.shape[0]
    src = np.full((T, n), -1, dtype=np.int64)
    for j in range(n):
        r = np.arange(T) + 1 + j
        ok = r < T
        ok[ok] &= doc[r[ok]] == doc[np.flatnonzero(ok)]
        src[ok, j] = r[ok]
    return src


def kept_tokens(ids: np.ndarray, index: np.ndarray, n_kept: int) -> np.ndarray:
    """Token ids -> kept row index, n_kept (the UNK row) for a token outside the kept vocabulary."""
    out = np.full(ids.shape, n_kept, dtype=np.int64)
    ok = (ids >= 0) & (ids < index.shape[0])
    out[ok] = np.where(index[ids[ok]] >= 0, index[ids[ok]], n_kept)
    return out


def _rms(z):
    return z / np.sqrt((z * z).mean(axis=-1, keepdims=True) + EPS)


def feature_step(f: np.ndarray, tok: np.ndarray, emb: np.ndarray, P: dict) -> tuple[np.ndarray, np.ndarray]:
    """The graph's computation in numpy: f [R, H] float32, tok [R] kept index (N = UNK) ->
    (feature [R, H], logits [R, N]) with emb [N, H] the kept lm_head rows (dequantized)."""
    z = f @ P["w_f"] + P["table"][tok]
    n = _rms(z)
    a = n @ P["w_g"]
    z = z + ((a / (1.0 + np.exp(-a))) * (n @ P["w_u"])) @ P["w_d"]
    out = (_rms(z) * P["g"]).astype(np.float32)
    return out, out @ emb.T


def train(hidden: np.ndarray, tok: np.ndarray, emb: np.ndarray, ids: np.ndarray, p: np.ndarray, src: np.ndarray,
          train_rows: np.ndarray, steps: int, inter: int, seed: int = 0, progress=None) -> dict[str, np.ndarray]:
    """Trains the block on hidden [T, H] (f_t), tok [T] (each row's input token as a kept index, N =
    UNK), the frozen kept lm_head rows emb [N, H], soft targets ids/p [T, n, K] at row t + 1 + j
    (heads.head_targets) and src [T, n] (chain_rows). Returns the graph's float32 weights (PARAMS)."""
    torch = fit.torch_seeded(seed)
    n, H = src.shape[1], hidden.shape[1]
    N = emb.shape[0]
    X = torch.from_numpy(np.ascontiguousarray(hidden, dtype=np.float32))
    E = torch.from_numpy(np.ascontiguousarray(emb, dtype=np.float32))
    T_tok, tid, tp, S = (torch.from_numpy(a) for a in (tok, ids, p, src))
    scale = float(np.sqrt((hidden.astype(np.float64) ** 2).mean()))  # the target's normed scale
    w_f = torch.eye(H).requires_grad_()  # start: z = f, so f^ ~ f (the target's own next token)
    w_e = torch.zeros(H, H, requires_grad=True)
    b = torch.zeros(H, requires_grad=True)
    unk = torch.zeros(1, H, requires_grad=True)
    w_g = (torch.randn(H, inter) / math.sqrt(H)).requires_grad_()
    w_u = (torch.randn(H, inter) / math.sqrt(H)).requires_grad_()
    w_d = torch.zeros(inter, H, requires_grad=True)
    g = torch.full((H,), scale, requires_grad=True)
    params = [w_f, w_e, b, unk, w_g, w_u, w_d, g]
    opt, sched = fit.adam_cosine(params, H, steps)

    def rms(z):
        return z * torch.rsqrt((z * z).mean(dim=-1, keepdim=True) + EPS)

    def block(f, x):
        e = torch.cat([E, unk])[x]
        z = f @ w_f + e @ w_e + b
        m = rms(z)
        z = z + (torch.nn.functional.silu(m @ w_g) * (m @ w_u)) @ w_d
        return rms(z) * g

    rng = np.random.default_rng(seed)
    rows = train_rows[src[train_rows, 0] >= 0]
    for _ in range(steps if rows.size else 0):
        batch = fit.batch_of(rng, rows)
        f = X[batch]
        loss = torch.zeros(())
        for j in range(n):
            r = S[batch, j]
            ok = r >= 0
            if not bool(ok.any()):
                break
            rr = r.clamp(min=0)
            f = block(f, T_tok[rr])
            logp = torch.log_softmax(f[ok] @ E.T, dim=-1)
            p_b = tp[batch[ok], j]
            got = torch.gather(logp, 1, tid[batch[ok], j].clamp(min=0)) * p_b  # p is 0 where ids is -1
            ce = -got.sum() / p_b.sum().clamp(min=1e-6)
            reg = torch.nn.functional.smooth_l1_loss(f[ok], X[rr[ok]])
            loss = loss + STEP_DECAY ** j * (ce + REG_WEIGHT * reg)
        fit.step(opt, sched, loss, progress)
    with torch.no_grad():
        table = torch.cat([E, unk]) @ w_e + b
    out = {"w_f": w_f, "table": table, "w_g": w_g, "w_u": w_u, "w_d": w_d, "g": g}
    return {k: np.ascontiguousarray(v.detach().numpy(), dtype=np.float32) for k, v in out.items()}


def start_params(hidden: np.ndarray, n_kept: int, inter: int) -> dict[str, np.ndarray]:
    """The training's zero-learning start (f^ = the normed f: the lm_head's own next token)."""
    H = hidden.shape[1]
    z = lambda *s: np.zeros(s, np.float32)  # noqa: E731
    scale = float(np.sqrt((hidden.astype(np.float64) ** 2).mean()))
    return {"w_f": np.eye(H, dtype=np.float32), "table": z(n_kept + 1, H), "w_g": z(H, inter), "w_u": z(H, inter),
            "w_d": z(inter, H), "g": np.full(H, scale, np.float32)}


def heldout_top1(hidden, tok, emb, P, kept, labels, src, rows, own: bool) -> tuple[list[float], list[float]]:
    """Per chain position j over positions `rows`: the fraction where the drafted token (the
    argmax of f^_{t+1+j}'s logits) is the target's argmax at row t + 1 + j, and the fraction where
    positions 0..j all are (a chain's acceptance under greedy verification). Inputs at j >= 1: the
    true tokens x_{t+1+j}, or (own) the model's own drafted tokens, as at run time."""
    n, N = src.shape[1], emb.shape[0]
    hits, chain, count = np.zeros(n), np.zeros(n), np.zeros(n)
    rows = rows[src[rows, 0] >= 0]
    for s in range(0, rows.size, 512):
        part = rows[s:s + 512]
        f = hidden[part]
        x = tok[src[part, 0]]
        alive = np.ones(part.size, bool)
        for j in range(n):
            r = src[part, j]
            ok = (r >= 0) & (labels[part, j] >= 0)
            f, lg = feature_step(f, x, emb, P)
            pred = lg.argmax(axis=1)
            hit = ok & (kept[pred] == labels[part, j])
            alive &= hit
            hits[j] += hit.sum()
            chain[j] += alive.sum()
            count[j] += ok.sum()
            if j + 1 < n:
                x = pred if own else tok[np.maximum(src[part, j + 1], 0)]
    den = np.maximum(count, 1)
    return [round(float(v), 4) for v in hits / den], [round(float(v), 4) for v in chain / den]
