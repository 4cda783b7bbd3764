"""Tiny GGUF files, written the way llama.cpp lays one out, with numpy and the gguf writer alone (no
torch): `write_gguf` is the one writer; `make_gguf` feeds it random weights in any block type the native
exporter maps (its tests, a smoke export on a board, a check at a real model's shapes), tiny.make_tiny_gguf
the weights of a tiny Hugging Face model (the torch path's tests), `make_bad_gguf` the refusal tests.

gguf's numpy quantizers cover Q4_0/Q4_1/Q5_0/Q5_1/Q8_0; Q4_K and Q6_K are encoded here (valid blocks
by the format's layout, rounded to nearest: not llama.cpp's search for the best scales).
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Iterable

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


def llama_permute(x: np.ndarray, n_head: int) -> np.ndarray:
    """The row order llama.cpp stores llama q/k weights in (its rotary kernel pairs adjacent rows)."""
    return x.reshape(n_head, 2, x.shape[0] // n_head // 2, -1).swapaxes(1, 2).reshape(x.shape)


def write_gguf(out_path: str | Path, arch: str, tensors: Iterable[tuple[str, np.ndarray, str]], *, layers: int,
               context: int, hidden: int, ffn: int, heads: int, kv_heads: int, vocab: int, name: str,
               tok_dir: Path | None = None, rope_base: float = 10000.0, rms_eps: float = 1e-6,
               head_dim: int | None = None, file_type=None, pre: str = "qwen2", add_bos: bool = False) -> Path:
    """Writes a GGUF of `arch` (llama.cpp's name: "llama" for mistral too) with these hyperparameters, the
    tokenizer of `tok_dir` (tiny_tokenizer.make_tokenizer's; None: a fresh one) padded to `vocab` rows,
    and `tensors`: (GGUF name, float32 array, type: F32, F16 or a block type `encode` writes), in order.
    `head_dim`: written as the key and value lengths (qwen3); `file_type`: a gguf.LlamaFileType."""
    import gguf

    out_path = Path(out_path)
    w = gguf.GGUFWriter(out_path, arch)
    w.add_name(name)
    w.add_block_count(layers)
    w.add_context_length(context)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(float(rope_base))
    w.add_layer_norm_rms_eps(float(rms_eps))
    if head_dim is not None:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if file_type is not None:
        w.add_file_type(file_type)
    if tok_dir is None:
        from ..tiny_tokenizer import make_tokenizer

        with tempfile.TemporaryDirectory() as tmp:
            make_tokenizer(Path(tmp), vocab_size=400)
            _add_tokenizer(w, Path(tmp), vocab, pre=pre, add_bos=add_bos)
    else:
        _add_tokenizer(w, Path(tok_dir), vocab, pre=pre, add_bos=add_bos)
    for tensor_name, x, qtype in tensors:
        arr, raw = encode(x, qtype)
        w.add_tensor(tensor_name, arr, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out_path


def _add_tokenizer(w, tok_dir: Path, rows: int, *, pre: str, add_bos: bool) -> None:
    """The tokenizer of `tok_dir` as llama.cpp writes one into a GGUF: a "gpt2" BPE whose vocabulary is
    padded to the logits rows with UNUSED "[PADn]" tokens."""
    import gguf

    tj = json.loads((tok_dir / "tokenizer.json").read_text())
    tcfg = json.loads((tok_dir / "tokenizer_config.json").read_text())
    vocab = {**tj["model"]["vocab"], **{a["content"]: a["id"] for a in tj["added_tokens"]}}
    n_tok = max(vocab.values()) + 1
    tokens = [None] * rows
    for t, i in vocab.items():
        tokens[i] = t
    specials = {a["id"] for a in tj["added_tokens"] if a.get("special")}
    types = []
    for i in range(rows):
        if i >= n_tok:
            tokens[i] = f"[PAD{i}]"
            types.append(gguf.TokenType.UNUSED)
        else:
            types.append(gguf.TokenType.CONTROL if i in specials else gguf.TokenType.NORMAL)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(vocab[tcfg["eos_token"]])
    w.add_pad_token_id(vocab[tcfg["pad_token"]])
    w.add_bos_token_id(vocab["<|endoftext|>"])
    w.add_add_bos_token(add_bos)
    if tcfg.get("chat_template"):
        w.add_chat_template(tcfg["chat_template"])


def make_gguf(out_path: str | Path, *, arch: str = "qwen2", types: dict[str, str] | str = "Q8_0", hidden: int = 256,
              heads: int = 4, kv_heads: int = 2, ffn: int = 768, layers: int = 2, vocab: int = 576,
              tied: bool = False, seed: int = 0, context: int = 512) -> Path:
    """A random `arch` model as llama.cpp lays one out (llama q/k rows interleaved, norms F32), its
    matrices in `types` (one type, or one per kind: embed q k v o gate up down head), with the tiny
    byte-level tokenizer. hidden and ffn multiples of 256 allow the k-quants (no MatMul but the lm_head has as many
    rows as the vocabulary: the bundle check tells the lm_head by its rows)."""
    kinds = types if isinstance(types, dict) else {k: types for k in Q4_K_M}
    rng = np.random.default_rng(seed)
    hd = hidden // heads

    def mat(n: int, k: int, std: float) -> np.ndarray:
        return (rng.standard_normal((n, k)) * std).astype(np.float32)

    def norm() -> np.ndarray:
        return 1 + 0.1 * rng.standard_normal(hidden).astype(np.float32)

    def tensors() -> Iterable[tuple[str, np.ndarray, str]]:  # drawn in the order written: the seed's weights
        yield "token_embd.weight", mat(vocab, hidden, 1.0), kinds["embed"]
        for i in range(layers):
            p = f"blk.{i}."
            yield p + "attn_norm.weight", norm(), "F32"
            q, k = mat(heads * hd, hidden, 0.15), mat(kv_heads * hd, hidden, 0.15)
            if arch == "llama":
                q, k = llama_permute(q, heads), llama_permute(k, kv_heads)
            yield p + "attn_q.weight", q, kinds["q"]
            yield p + "attn_k.weight", k, kinds["k"]
            yield p + "attn_v.weight", mat(kv_heads * hd, hidden, 0.15), kinds["v"]
            if arch == "qwen2":
                for t, n in (("q", heads * hd), ("k", kv_heads * hd), ("v", kv_heads * hd)):
                    yield p + f"attn_{t}.bias", 0.1 * rng.standard_normal(n).astype(np.float32), "F32"
            yield p + "attn_output.weight", mat(hidden, heads * hd, 0.15), kinds["o"]
            yield p + "ffn_norm.weight", norm(), "F32"
            yield p + "ffn_gate.weight", mat(ffn, hidden, 0.15), kinds["gate"]
            yield p + "ffn_up.weight", mat(ffn, hidden, 0.15), kinds["up"]
            yield p + "ffn_down.weight", mat(hidden, ffn, 0.1), kinds["down"]
        yield "output_norm.weight", norm(), "F32"
        if not tied:
            yield "output.weight", mat(vocab, hidden, 0.3), kinds["head"]

    return write_gguf(out_path, arch, tensors(), layers=layers, context=context, hidden=hidden, ffn=ffn, heads=heads,
                      kv_heads=kv_heads, vocab=vocab, name=f"tiny-{arch}")


def make_bad_gguf(out_path: str | Path, *, arch: str = "llama", tensor_type: str = "F32") -> Path:
    """A GGUF with one tensor and minimal metadata, for the refusal tests: an architecture we do not
    support, or a tensor type nothing can dequantize (e.g. Q8_K, llama.cpp's internal type)."""
    import gguf

    w = gguf.GGUFWriter(Path(out_path), arch)
    w.add_name("bad")
    w.add_block_count(1)
    qt = gguf.GGMLQuantizationType[tensor_type]
    if qt == gguf.GGMLQuantizationType.F32:
        w.add_tensor("token_embd.weight", np.zeros((4, 32), dtype=np.float32))
    else:
        block, size = gguf.GGML_QUANT_SIZES[qt]
        w.add_tensor("token_embd.weight", np.zeros((4, size), dtype=np.uint8), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(out_path)
