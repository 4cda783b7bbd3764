"""The GGUF's own forward pass in numpy (float32 over its dequantized weights): the parity reference
of a native export, so a board without torch checks its own bundle.

One decoder layer's weights are dequantized at a time (gguf's own dequantizer, not blocks.py's: an
independent reading of the file), run over all T tokens, and dropped; the lm_head is applied in
slices of rows. Memory: one layer's float weights + the activations [T, hidden] + [T, vocab].
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..parity import log_softmax
from .gguf_model import GGUFModel, layer_names

HEAD_ROWS = 8192  # lm_head rows dequantized at a time (~50 MB of float32 for a 1536-wide model)


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return (x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)) * w


def _rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotary embedding on halves (transformers' rotate_half): x [heads, T, d], cos/sin [T, d/2]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def forward_hidden(gg: GGUFModel, ids: Sequence[int], progress=None) -> np.ndarray:
    """The final normed hidden states [T, hidden] float32 of a causal pass over `ids` (no cache)."""
    c = gg.config
    t = len(ids)
    x = gg.floats("token_embd.weight", rows=np.asarray(ids))  # [T, H]: only the rows used
    gg.done("token_embd.weight")
    ang = np.arange(t, dtype=np.float64)[:, None] * gg.inv_freq()[None, :]
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    mask = np.triu(np.full((t, t), -np.inf, dtype=np.float32), k=1)
    group = c.heads // c.kv_heads
    for i in range(c.layers):
        n = layer_names(i)

        def lin(h: np.ndarray, name: str, bias: str | None = None) -> np.ndarray:
            y = h @ gg.floats(name).T
            if bias is not None and gg.has(bias):
                y = y + gg.floats(bias)
            return y

        h = _rms(x, gg.floats(n["attn_norm"]), c.eps)
        q = lin(h, n["q"], n["q_bias"]).reshape(t, c.heads, c.head_dim).transpose(1, 0, 2)
        k = lin(h, n["k"], n["k_bias"]).reshape(t, c.kv_heads, c.head_dim).transpose(1, 0, 2)
        v = lin(h, n["v"], n["v_bias"]).reshape(t, c.kv_heads, c.head_dim).transpose(1, 0, 2)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        k, v = np.repeat(k, group, axis=0), np.repeat(v, group, axis=0)
        scores = q @ k.transpose(0, 2, 1) / np.float32(np.sqrt(c.head_dim)) + mask
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        attn = (scores / scores.sum(axis=-1, keepdims=True)) @ v  # [heads, T, d]
        x = x + lin(attn.transpose(1, 0, 2).reshape(t, -1), n["o"])
        h = _rms(x, gg.floats(n["ffn_norm"]), c.eps)
        g = lin(h, n["gate"])
        x = x + ((g / (1 + np.exp(-g))) * lin(h, n["up"])) @ gg.floats(n["down"]).T
        for name in n.values():
            if gg.has(name):
                gg.done(name)
        if progress is not None:
            progress.update(1)
    return _rms(x, gg.floats("output_norm.weight"), c.eps).astype(np.float32)


def reference_logprobs(gg: GGUFModel, ids: Sequence[int], usable: int, progress=None) -> np.ndarray:
    """log-probabilities [T, usable] of the GGUF's float32 forward pass."""
    h = forward_hidden(gg, ids, progress)
    head = "token_embd.weight" if gg.config.tied else "output.weight"
    logits = np.empty((len(ids), usable), dtype=np.float32)
    for lo in range(0, usable, HEAD_ROWS):
        hi = min(usable, lo + HEAD_ROWS)
        logits[:, lo:hi] = h @ gg.floats(head, lo, hi).T
    gg.done(head)
    if progress is not None:
        progress.update(1)
    for lo in range(0, len(logits), 64):  # in place, a few rows at a time: no second [T, V] array
        logits[lo:lo + 64] = log_softmax(logits[lo:lo + 64])
    return logits
