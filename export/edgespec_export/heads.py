"""Medusa draft heads trained at export (`edgespec export ... --heads medusa`), on the user's CPU.

    data (heads_data.py)  teacher-forced target passes: hidden state h_t, the target's next-token
                          argmax and top-16 distribution at every position of offline text
    train (here)          head i: r = h + SiLU(W_i h + b_i), logits = r @ E_kept^T, E_kept the target's
                          own lm_head rows for a kept vocabulary (frozen); trained with torch on the
                          CPU to predict the target's distribution at t + 2 + i (soft cross-entropy
                          over its top 16, which also trains the argmax greedy verification accepts)
    graph (heads_graph.py) heads/model.onnx + heads/vocab_map.npy in the bundle

W starts at zero, so an untrained head is the target's own lm_head: the held-out top-1 of that start
is recorded next to the trained one (the learning the training did, measured). Everything runs in
one child process (isolate.py): the target graph, the data and torch are gone when it returns.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import fit
from .fit import BATCH
from .heads_data import ANSWER_TOKENS, CHUNK, DOC_TOKENS, HOLDOUT_EVERY, LOCAL_CORPUS, PROMPT_SETS, SOFT_K, Collected

HEADS_DIR = "heads"
HEADS_FILE = "model.onnx"
VOCAB_MAP = "vocab_map.npy"
METHODS = ("medusa", "feature")  # feature: the EAGLE-style feature drafter (feature.py)
HEAD_WEIGHT_DECAY = 0.8  # loss weight of head i: 0.8^i (later heads are less often reached)


@dataclass
class HeadsOptions:
    """`edgespec export --heads medusa|feature` and its --heads-* options (docs/export.md, "Draft heads");
    n_heads is the feature drafter's chain length (the unrolled training depth)."""

    method: str = "medusa"
    n_heads: int = 3
    tokens: int = 16384  # teacher-forced tokens (training + held out)
    steps: int = 600  # optimizer steps of BATCH positions
    answers: int = 8  # shipped prompts the target answers (greedy) for the data
    vocab: int = 8192  # kept lm_head rows (0: the whole usable vocabulary)
    ffn: int = 0  # feature: the block's SwiGLU intermediate size (0: the target's hidden size)
    seed: int = 0


@dataclass
class HeadsJob:
    target_path: Path  # the exported target graph
    facts: dict  # its ModelFacts as a dict
    tokenizer_json: Path
    chat_template: str | None
    bos_eos_text: tuple[str, str]
    usable: int
    eos_ids: list[int]
    always: list[int]  # ids the kept vocabulary always holds (end tokens, chat markers)
    out_dir: Path  # <bundle>.partial/heads
    options: HeadsOptions = field(default_factory=HeadsOptions)


def check_options(o: HeadsOptions) -> str | None:
    """The first problem with the options, as the one-line error the CLI shows, or None."""
    if o.method not in METHODS:
        return f"--heads {o.method!r}: methods are {', '.join(METHODS)}"
    for label, v, lo in (("--heads-n", o.n_heads, 1), ("--heads-tokens", o.tokens, 64), ("--heads-steps", o.steps, 1),
                         ("--heads-answers", o.answers, 0), ("--heads-vocab", o.vocab, 0),
                         ("--heads-ffn", o.ffn, 0)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            return f"{label} {v!r}: must be a whole number, at least {lo}"
    if o.n_heads > 8:
        return f"--heads-n {o.n_heads}: at most 8 heads"
    if o.ffn and o.method != "feature":
        return f"--heads-ffn {o.ffn}: only the feature drafter has a feed-forward block (--heads feature)"
    return None


# --- training ----------------------------------------------------------------------------------------
def head_targets(c: Collected, n_heads: int, index: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per position t and head i, the target row t + 1 + i of the same document: soft ids mapped to
    kept rows (-1: not kept or past the document's end), their probabilities, and the argmax token id
    (-1 past the end). Shapes [T, n, K], [T, n, K], [T, n]."""
    T, K = c.top_ids.shape
    ids = np.full((T, n_heads, K), -1, dtype=np.int64)
    p = np.zeros((T, n_heads, K), dtype=np.float32)
    top1 = np.full((T, n_heads), -1, dtype=np.int64)
    for i in range(n_heads):
        src = np.arange(T) + 1 + i
        ok = src < T
        ok[ok] &= c.doc[src[ok]] == c.doc[np.flatnonzero(ok)]
        rows = src[ok]
        mapped = index[c.top_ids[rows]]
        ids[ok, i] = mapped
        p[ok, i] = np.where(mapped >= 0, c.top_p[rows], 0.0)
        top1[ok, i] = c.argmax[rows]
    return ids, p, top1


def train(hidden: np.ndarray, emb: np.ndarray, ids: np.ndarray, p: np.ndarray, train_rows: np.ndarray, steps: int,
          seed: int = 0, progress=None) -> tuple[np.ndarray, np.ndarray]:
    """Trains W [n, H, H], b [n, H] (zero start) on hidden [T, H] with the frozen lm_head rows emb
    [N, H] toward the soft targets ids/p [T, n, K] (kept-row ids, -1 = none) at train_rows.
    Returns float32 (W, b)."""
    torch = fit.torch_seeded(seed)
    n, H = ids.shape[1], hidden.shape[1]
    X = torch.from_numpy(np.ascontiguousarray(hidden, dtype=np.float32))
    E = torch.from_numpy(np.ascontiguousarray(emb, dtype=np.float32))
    tid = torch.from_numpy(ids)
    tp = torch.from_numpy(p)
    W = torch.zeros(n, H, H, requires_grad=True)
    b = torch.zeros(n, H, requires_grad=True)
    opt, sched = fit.adam_cosine([W, b], H, steps)
    weights = torch.tensor([HEAD_WEIGHT_DECAY ** i for i in range(n)])
    rng = np.random.default_rng(seed)
    rows = train_rows[(p[train_rows].sum(axis=(1, 2)) > 0)]
    if rows.size == 0:
        return W.detach().numpy(), b.detach().numpy()
    for step in range(steps):
        batch = fit.batch_of(rng, rows)
        x = X[batch]
        r = x[:, None, :] + torch.nn.functional.silu(torch.einsum("bh,nhk->bnk", x, W) + b)
        logp = torch.log_softmax(r @ E.T, dim=-1)  # [B, n, N]
        ids_b, p_b = tid[batch], tp[batch]
        got = torch.gather(logp, 2, ids_b.clamp(min=0)) * p_b  # p is 0 where ids is -1
        mass = p_b.sum(dim=2)  # [B, n]
        per_head = -(got.sum(dim=2)).sum(dim=0) / mass.sum(dim=0).clamp(min=1e-6)
        fit.step(opt, sched, (per_head * weights).sum(), progress)
    return W.detach().numpy().astype(np.float32), b.detach().numpy().astype(np.float32)


def head_logits(hidden: np.ndarray, emb: np.ndarray, W: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The heads' logits over the kept rows, [T, n, N] (numpy, the graph's computation)."""
    z = np.einsum("th,nhk->tnk", hidden, W) + b
    r = hidden[:, None, :] + z / (1.0 + np.exp(-z))
    return r @ emb.T


def top1(hidden, emb, W, b, kept: np.ndarray, top1_ids: np.ndarray, rows: np.ndarray) -> list[float]:
    """Per head, the fraction of positions `rows` (with a target row) where the head's argmax is the
    target's argmax: the acceptance greedy verification would give head i alone."""
    out = []
    for i in range(top1_ids.shape[1]):
        r = rows[top1_ids[rows, i] >= 0]
        if r.size == 0:
            out.append(0.0)
            continue
        hits = 0
        for s in range(0, r.size, 512):
            part = r[s:s + 512]
            lg = head_logits(hidden[part], emb, W[i:i + 1], b[i:i + 1])[:, 0]
            hits += int((kept[lg.argmax(axis=1)] == top1_ids[part, i]).sum())
        out.append(round(hits / r.size, 4))
    return out


def _fit_medusa(job: HeadsJob, data: Collected, emb, kept, index, ids, p, top1_ids, train_rows, held_rows,
                progress) -> dict[str, Any]:
    """Trains the Medusa heads, writes their graph; returns the record's training fields."""
    from .heads_graph import write_heads_graph

    o = job.options
    t1 = time.perf_counter()
    with progress.stage(f"heads: train {o.n_heads} medusa heads", total=o.steps, unit="step") as bar:
        W, b = train(data.hidden, emb, ids, p, train_rows, o.steps, o.seed, bar)
    t_train = time.perf_counter() - t1
    zero_w, zero_b = np.zeros_like(W), np.zeros_like(b)
    write_heads_graph(job.out_dir / HEADS_FILE, job.target_path, kept, W, b)
    return {
        "heldout_top1": top1(data.hidden, emb, W, b, kept, top1_ids, held_rows),  # per head: argmax == the target's at t + 2 + i
        "heldout_top1_untrained": top1(data.hidden, emb, zero_w, zero_b, kept, top1_ids, held_rows),  # W = 0: the lm_head alone
        "train_top1": top1(data.hidden, emb, W, b, kept, top1_ids, train_rows[:4096]),
        "train_seconds": round(t_train, 1),
    }


def _fit_feature(job: HeadsJob, data: Collected, emb, kept, index, ids, p, top1_ids, train_rows, held_rows,
                 progress) -> dict[str, Any]:
    """Trains the feature drafter (feature.py), writes its graph; returns the record's training fields."""
    from . import feature as ft
    from .heads_graph import write_feature_graph

    o = job.options
    inter = o.ffn or int(data.hidden.shape[1])
    src = ft.chain_rows(data.doc, o.n_heads)
    tok = ft.kept_tokens(data.ids, index, kept.size)  # each row's own token: step j reads tok[t + 1 + j]
    t1 = time.perf_counter()
    with progress.stage(f"heads: train the feature drafter ({o.n_heads} steps deep)", total=o.steps, unit="step") as bar:
        P = ft.train(data.hidden, tok, emb, ids, p, src, train_rows, o.steps, inter, o.seed, bar)
    t_train = time.perf_counter() - t1
    write_feature_graph(job.out_dir / HEADS_FILE, job.target_path, kept, P)
    own, chain = ft.heldout_top1(data.hidden, tok, emb, P, kept, top1_ids, src, held_rows, own=True)
    start = ft.start_params(data.hidden, kept.size, inter)
    return {
        "ffn": inter, "reg_weight": ft.REG_WEIGHT,
        # per chain position j: the drafted token == the target's argmax at t + 2 + j, the inputs at
        # j >= 1 the model's own drafted tokens (as at run time); its "chain": positions 0..j all hit
        "heldout_top1": own, "heldout_chain": chain,
        "heldout_top1_true_inputs": ft.heldout_top1(data.hidden, tok, emb, P, kept, top1_ids, src, held_rows, own=False)[0],
        "heldout_top1_untrained": ft.heldout_top1(data.hidden, tok, emb, start, kept, top1_ids, src, held_rows, own=True)[0],
        "train_top1": ft.heldout_top1(data.hidden, tok, emb, P, kept, top1_ids, src, train_rows[:4096], own=True)[0],
        "train_seconds": round(t_train, 1),
    }


# --- the export step ---------------------------------------------------------------------------------
def train_heads(job: HeadsJob, progress=None) -> dict[str, Any]:
    """Data, training and the heads graph: writes job.out_dir/{model.onnx, vocab_map.npy}. Returns the
    manifest's heads record (paths relative to the bundle)."""
    from .progress import NullProgress

    progress = progress or NullProgress()
    t0 = time.perf_counter()
    data, answered = gather(job, progress)
    return fit_heads(job, data, answered, time.perf_counter() - t0, progress)


def gather(job: HeadsJob, progress) -> tuple[Collected, int]:
    """The training data (heads_data.py) through the exported target, and the target's answer tokens
    among it; the target's session is gone when it returns."""
    from tokenizers import Tokenizer

    from edgespec.engine.build import load_runner
    from edgespec.models.manifest import ModelFacts

    from .heads_data import build_docs, collect

    o = job.options
    facts = ModelFacts(**job.facts)
    tok = Tokenizer.from_file(str(job.tokenizer_json))
    max_len = max(CHUNK, DOC_TOKENS) + 2 * ANSWER_TOKENS + 1024
    runner = load_runner(job.target_path, facts, max_len=min(max_len, facts.max_context))
    if not runner.has_hidden:
        raise ValueError("the target graph has no hidden_states output (graph contract v3)")
    docs, answered = build_docs(tok, job.chat_template, job.bos_eos_text, o.tokens, o.answers, runner, job.usable,
                                set(job.eos_ids), runner.max_len, progress)
    return collect(runner, docs, job.usable, progress), answered


def fit_heads(job: HeadsJob, data: Collected, answered: int, t_data: float, progress) -> dict[str, Any]:
    """Training on gathered data and the heads graph (train_heads' second half; a measurement may
    call it again on the same data with other options). Returns the manifest's heads record."""
    from edgespec.units import peak_rss_bytes

    from .heads_graph import lm_head_rows
    from .prune_vocab import choose_kept

    o = job.options
    t0 = time.perf_counter() - t_data
    docs = data.docs
    n_vocab = o.vocab if 0 < o.vocab < job.usable else job.usable
    corpus = np.concatenate([np.concatenate([np.asarray(d.ids) for d in docs if not d.heldout] or [np.zeros(0, int)]),
                             data.argmax[~data.heldout]])
    kept = (choose_kept(n_vocab, job.usable, corpus_ids=corpus, always=job.always) if n_vocab < job.usable
            else np.arange(job.usable, dtype=np.int64))
    index = np.full(max(job.usable, int(data.top_ids.max()) + 1), -1, dtype=np.int64)
    index[kept] = np.arange(kept.size)
    emb = lm_head_rows(job.target_path, kept)
    ids, p, top1_ids = head_targets(data, o.n_heads, index)
    rows = np.arange(len(data.hidden))
    train_rows, held_rows = rows[~data.heldout], rows[data.heldout]

    job.out_dir.mkdir(parents=True, exist_ok=True)
    fit = _fit_medusa if o.method == "medusa" else _fit_feature
    part = fit(job, data, emb, kept, index, ids, p, top1_ids, train_rows, held_rows, progress)
    np.save(job.out_dir / VOCAB_MAP, kept.astype(np.int32))
    rel = job.out_dir.name
    return {
        "method": o.method,
        "path": f"{rel}/{HEADS_FILE}",
        "vocab_map": f"{rel}/{VOCAB_MAP}",
        "n_heads": o.n_heads,  # feature: the chain length it was trained for
        "hidden_size": int(data.hidden.shape[1]),
        "kept": int(kept.size),
        "training": {
            "data": {"prompt_sets": list(PROMPT_SETS), "local_corpus": LOCAL_CORPUS,
                     "target_answer_tokens": answered, "soft_targets": f"the target's top {SOFT_K} probabilities"},
            "split": {"rule": f"every {HOLDOUT_EVERY}th document of each source is held out",
                      "train_tokens": int(train_rows.size), "heldout_tokens": int(held_rows.size),
                      "heldout_docs": [d.name for d in docs if d.heldout]},
            "steps": o.steps, "batch": BATCH, "seed": o.seed, **part,
            "data_seconds": round(t_data, 1),
            "seconds": round(time.perf_counter() - t0, 1), "peak_rss_bytes": peak_rss_bytes(),
        },
    }
