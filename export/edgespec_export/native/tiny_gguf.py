"""Tiny random GGUF files written with numpy and the gguf writer alone (no torch), in any block type
the native exporter maps: for its tests, and for a smoke export on a board.

gguf's numpy quantizers cover Q4_0/Q4_1/Q5_0/Q5_1/Q8_0; Q4_K and Q6_K are encoded here (valid blocks
by the format's layout, rounded to nearest: not llama.cpp's search for the best scales).
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

QK_K = 256
# what llama.cpp's Q4_K_M file of the default target holds, per tensor kind (v and down alternate there)
Q4_K_M = {"embed": "Q4_K", "q": "Q4_K", "k": "Q4_K", "v": "Q6_K", "o": "Q4_K", "gate": "Q4_K", "up": "Q4_K",
          "down": "Q6_K", "head": "Q6_K"}


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """float32 [N, K] (K a multiple of 256) -> Q4_K bytes [N, K / 256 * 144]."""
    n = x.shape[0]
    b = x.reshape(n, -1, 8, 32).astype(np.float32)
    lo = np.minimum(b.min(axis=-1), 0)  # [n, S, 8]
    scale = (b.max(axis=-1) - lo) / 15
    d = np.maximum(scale.max(axis=-1, keepdims=True) / 63, 1e-8).astype(np.float16).astype(np.float32)
    dmin = np.maximum((-lo).max(axis=-1, keepdims=True) / 63, 1e-8).astype(np.float16).astype(np.float32)
    sc = np.clip(np.rint(scale / d), 1, 63).astype(np.uint8)
    m = np.clip(np.rint(-lo / dmin), 0, 63).astype(np.uint8)
    q = np.clip(np.rint((b + (dmin * m)[..., None]) / (d * sc)[..., None]), 0, 15).astype(np.uint8)
    scales = np.zeros((n, b.shape[1], 12), dtype=np.uint8)
    scales[..., 0:4] = (sc[..., :4] & 63) | ((sc[..., 4:] >> 4) << 6)
    scales[..., 4:8] = (m[..., :4] & 63) | ((m[..., 4:] >> 4) << 6)
    scales[..., 8:12] = (sc[..., 4:] & 15) | ((m[..., 4:] & 15) << 4)
    q = q.reshape(n, -1, 4, 2, 32)  # 4 groups of 64: low nibbles = the first 32, high = the next 32
    qs = (q[..., 0, :] | (q[..., 1, :] << 4)).reshape(n, -1, 128)
    head = np.concatenate([d.astype(np.float16).view(np.uint8).reshape(n, -1, 2),
                           dmin.astype(np.float16).view(np.uint8).reshape(n, -1, 2)], axis=-1)
    return np.concatenate([head, scales, qs], axis=-1).reshape(n, -1)


def quantize_q6_k(x: np.ndarray) -> np.ndarray:
    """float32 [N, K] (K a multiple of 256) -> Q6_K bytes [N, K / 256 * 210]."""
    n = x.shape[0]
    b = x.reshape(n, -1, 16, 16).astype(np.float32)
    scale = np.abs(b).max(axis=-1) / 31  # [n, S, 16]
    d = np.maximum(scale.max(axis=-1, keepdims=True) / 127, 1e-8).astype(np.float16).astype(np.float32)
    sc = np.clip(np.rint(scale / d), 1, 127).astype(np.int8)
    q = (np.clip(np.rint(b / (d * sc)[..., None]), -32, 31) + 32).astype(np.uint8).reshape(n, -1, 2, 4, 32)
    ql = np.concatenate([(q[..., 0, :] & 15) | ((q[..., 2, :] & 15) << 4),
                         (q[..., 1, :] & 15) | ((q[..., 3, :] & 15) << 4)], axis=-1)  # [n, S, 2, 64]
    qh = (q[..., 0, :] >> 4) | ((q[..., 1, :] >> 4) << 2) | ((q[..., 2, :] >> 4) << 4) | ((q[..., 3, :] >> 4) << 6)
    parts = [ql.reshape(n, -1, 128), qh.reshape(n, -1, 64), sc.view(np.uint8),
             d.astype(np.float16).view(np.uint8).reshape(n, -1, 2)]
    return np.concatenate(parts, axis=-1).reshape(n, -1)


def encode(x: np.ndarray, qtype: str) -> tuple[np.ndarray, object]:
    """(array, raw_dtype) for GGUFWriter.add_tensor."""
    import gguf

    if qtype == "F32":
        return x.astype(np.float32), None
    if qtype == "F16":
        return x.astype(np.float16), None
    t = gguf.GGMLQuantizationType[qtype]
    if qtype == "Q4_K":
        return quantize_q4_k(x), t
    if qtype == "Q6_K":
        return quantize_q6_k(x), t
    return gguf.quants.quantize(x.astype(np.float32), t), t


def make_gguf(out_path: str | Path, *, arch: str = "qwen2", types: dict[str, str] | str = "Q8_0", hidden: int = 256,
              heads: int = 4, kv_heads: int = 2, ffn: int = 768, layers: int = 2, vocab: int = 576,
              tied: bool = False, seed: int = 0, context: int = 512) -> Path:
    """A random `arch` model as llama.cpp lays one out (llama q/k rows interleaved, norms F32), its
    matrices in `types` (one type, or one per kind: embed q k v o gate up down head), with the tiny
    byte-level tokenizer. hidden and ffn multiples of 256 allow the k-quants (no MatMul but the lm_head has as many
    rows as the vocabulary: the bundle check tells the lm_head by its rows)."""
    import gguf

    from ..tiny import add_gguf_tokenizer, make_tokenizer

    kinds = types if isinstance(types, dict) else {k: types for k in Q4_K_M}
    rng = np.random.default_rng(seed)
    hd = hidden // heads
    out_path = Path(out_path)
    w = gguf.GGUFWriter(out_path, arch)
    w.add_name(f"tiny-{arch}")
    w.add_block_count(layers)
    w.add_context_length(context)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    with tempfile.TemporaryDirectory() as tmp:
        make_tokenizer(Path(tmp), vocab_size=400)
        add_gguf_tokenizer(w, Path(tmp), vocab)

    def mat(n: int, k: int, std: float) -> np.ndarray:
        return (rng.standard_normal((n, k)) * std).astype(np.float32)

    def put(name: str, x: np.ndarray, kind: str | None = None) -> None:
        arr, raw = encode(x, kinds[kind]) if kind else (x.astype(np.float32), None)
        w.add_tensor(name, arr, raw_dtype=raw)

    def perm(x: np.ndarray, n_head: int) -> np.ndarray:  # llama.cpp's interleaving of q/k rows
        return x.reshape(n_head, 2, x.shape[0] // n_head // 2, -1).swapaxes(1, 2).reshape(x.shape)

    put("token_embd.weight", mat(vocab, hidden, 1.0), "embed")
    for i in range(layers):
        p = f"blk.{i}."
        put(p + "attn_norm.weight", 1 + 0.1 * rng.standard_normal(hidden).astype(np.float32))
        q, k = mat(heads * hd, hidden, 0.15), mat(kv_heads * hd, hidden, 0.15)
        if arch == "llama":
            q, k = perm(q, heads), perm(k, kv_heads)
        put(p + "attn_q.weight", q, "q")
        put(p + "attn_k.weight", k, "k")
        put(p + "attn_v.weight", mat(kv_heads * hd, hidden, 0.15), "v")
        if arch == "qwen2":
            for t, n in (("q", heads * hd), ("k", kv_heads * hd), ("v", kv_heads * hd)):
                put(p + f"attn_{t}.bias", 0.1 * rng.standard_normal(n).astype(np.float32))
        put(p + "attn_output.weight", mat(hidden, heads * hd, 0.15), "o")
        put(p + "ffn_norm.weight", 1 + 0.1 * rng.standard_normal(hidden).astype(np.float32))
        put(p + "ffn_gate.weight", mat(ffn, hidden, 0.15), "gate")
        put(p + "ffn_up.weight", mat(ffn, hidden, 0.15), "up")
        put(p + "ffn_down.weight", mat(hidden, ffn, 0.1), "down")
    put("output_norm.weight", 1 + 0.1 * rng.standard_normal(hidden).astype(np.float32))
    if not tied:
        put("output.weight", mat(vocab, hidden, 0.3), "head")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out_path
