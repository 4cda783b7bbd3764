"""A GGUF file as the native exporter reads it: the architecture's numbers and its tensors by role,
rows in Hugging Face order, nothing dequantized until asked.

Supported: `qwen2` (Qwen2.5) and `llama` (SmolLM2, Llama 3.x). llama.cpp's converter permutes the
rows of a llama model's q and k weights so its rotary embedding can rotate interleaved pairs; the
exported graph rotates halves (GroupQueryAttention's rotary_interleaved=0, as the builder's graphs do),
so those rows are put back. A row permutation moves whole rows of blocks: exact for every block type.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgespec.errors import ExportError

ARCHS = ("llama", "qwen2")  # general.architecture values this exporter builds graphs for
PERMUTED_QK = ("llama",)  # architectures whose q/k rows llama.cpp's converter interleaves


class UnsupportedGGUF(ExportError):
    pass


@dataclass
class Config:
    arch: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    eps: float
    rope_theta: float
    context: int
    tied: bool

    def hf_dict(self) -> dict:
        """The Hugging Face config.json fields the manifest facts are read from (build.facts_from_config)."""
        return {"model_type": self.arch, "num_hidden_layers": self.layers, "hidden_size": self.hidden,
                "num_attention_heads": self.heads, "num_key_value_heads": self.kv_heads, "head_dim": self.head_dim,
                "intermediate_size": self.ffn, "vocab_size": self.vocab, "rms_norm_eps": self.eps,
                "rope_theta": self.rope_theta, "max_position_embeddings": self.context,
                "tie_word_embeddings": self.tied}


class GGUFModel:
    """Opens `path` (memory-mapped by the gguf reader) and checks what the export needs, cheaply."""

    def __init__(self, path: Path, where: str = "source"):
        from ..gguf_file import GGUFFile

        self.path = Path(path)
        try:
            self.reader = GGUFFile(self.path)
        except Exception as e:  # a truncated or damaged file fails in many ways inside the reader
            raise ExportError(f"{where} {path}: cannot read the GGUF file ({type(e).__name__}: {e})") from e
        self.tensors = {t.name: t for t in self.reader.tensors}
        arch = self._field("general.architecture")
        if arch not in ARCHS:
            raise UnsupportedGGUF(f"{where} {path}: GGUF architecture {arch!r} is not supported by the native "
                                  f"exporter; it builds {', '.join(ARCHS)} (Qwen2.5, SmolLM2, Llama 3.x)")
        self.config = self._config(arch, where)
        self.release = self.reader.release

    def _field(self, key: str, default=None):
        v = self.reader.fields.get(key)
        return default if v is None else v

    def _config(self, arch: str, where: str) -> Config:
        def need(key: str):
            v = self._field(f"{arch}.{key}")
            if v is None:
                raise ExportError(f"{where} {self.path}: the GGUF metadata has no {arch}.{key}")
            return v

        scaling = self._field(f"{arch}.rope.scaling.type")
        if scaling not in (None, "none") :
            raise UnsupportedGGUF(f"{where} {self.path}: rope scaling {scaling!r} is not supported by the native "
                                  "exporter (use --via torch)")
        hidden, heads = int(need("embedding_length")), int(need("attention.head_count"))
        head_dim = int(self._field(f"{arch}.attention.key_length") or hidden // heads)
        rope_dims = self._field(f"{arch}.rope.dimension_count")
        if rope_dims is not None and int(rope_dims) != head_dim:
            raise UnsupportedGGUF(f"{where} {self.path}: partial rotary ({rope_dims} of {head_dim}) is not supported")
        if "token_embd.weight" not in self.tensors:
            raise ExportError(f"{where} {self.path}: the GGUF file has no token_embd.weight")
        vocab = int(self.tensors["token_embd.weight"].shape[1])
        return Config(
            arch=arch, layers=int(need("block_count")), hidden=hidden, heads=heads,
            kv_heads=int(self._field(f"{arch}.attention.head_count_kv") or heads), head_dim=head_dim,
            ffn=int(need("feed_forward_length")), vocab=vocab,
            eps=float(need("attention.layer_norm_rms_epsilon")),
            rope_theta=float(self._field(f"{arch}.rope.freq_base") or 10000.0),
            context=int(self._field(f"{arch}.context_length") or 2048),
            tied="output.weight" not in self.tensors,
        )

    # --- tensors ----------------------------------------------------------------------------------
    def has(self, name: str) -> bool:
        return name in self.tensors

    def type_name(self, name: str) -> str:
        return self.tensors[name].tensor_type.name

    def shape(self, name: str) -> tuple[int, int]:
        """(N, K): rows (outputs) and row length (inputs) of a 2-D weight."""
        t = self.tensors[name]
        return int(t.shape[1]), int(t.shape[0])

    def row_order(self, name: str) -> np.ndarray | None:
        """Hugging Face row i is GGUF row order[i] (llama q/k), or None when the rows are as stored."""
        c = self.config
        if c.arch not in PERMUTED_QK:
            return None
        heads = c.heads if name.endswith("attn_q.weight") or name.endswith("attn_q.bias") else \
            c.kv_heads if name.endswith("attn_k.weight") or name.endswith("attn_k.bias") else None
        if heads is None:
            return None
        n = heads * c.head_dim
        return np.arange(n).reshape(heads, c.head_dim // 2, 2).swapaxes(1, 2).reshape(n)

    def raw_rows(self, name: str, lo: int = 0, hi: int | None = None, rows=None) -> np.ndarray:
        """Rows lo..hi (or the rows `rows`) in Hugging Face order: uint8 [rows, bytes per row] for a
        block type, the float array [rows, K] for F32/F16/BF16 (BF16 as uint16 bits)."""
        t = self.tensors[name]
        n, _k = self.shape(name)
        data = np.asarray(t.data).reshape(n, -1)
        order = self.row_order(name)
        hi = n if hi is None else hi
        pick = np.asarray(rows) if rows is not None else np.arange(lo, hi)
        if order is not None:
            return np.array(data[order[pick]])
        return np.array(data[pick]) if rows is not None else np.array(data[lo:hi])

    def floats(self, name: str, lo: int = 0, hi: int | None = None, rows=None) -> np.ndarray:
        """Rows lo..hi (or `rows`) dequantized to float32 [rows, K] (a 1-D tensor: [K])."""
        from gguf import GGMLQuantizationType, dequantize

        t = self.tensors[name]
        if len(t.shape) == 1:
            out = np.array(t.data, dtype=np.float32).reshape(-1)
            order = self.row_order(name)
            return out[order] if order is not None else out
        raw = self.raw_rows(name, lo, hi, rows)
        if t.tensor_type == GGMLQuantizationType.F32:
            return raw.astype(np.float32, copy=False)
        if t.tensor_type == GGMLQuantizationType.F16:
            return raw.astype(np.float32)
        if t.tensor_type == GGMLQuantizationType.BF16:
            return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        return dequantize(raw, t.tensor_type).astype(np.float32, copy=False).reshape(raw.shape[0], -1)

    def step_bytes(self) -> int:
        """Bytes of the file's tensors a llama.cpp decode step reads: every tensor but the token embedding
        (one row of it per token), which a tied model's output reads whole as its lm_head."""
        return sum(int(t.n_bytes) for name, t in self.tensors.items()
                   if name != "token_embd.weight" or self.config.tied)

    def done(self, name: str) -> None:
        """Hands the tensor's pages of the mapped file back to the kernel (keeps RSS to the tensor at hand)."""
        self.release(self.tensors[name])

    def rope_factors(self) -> np.ndarray | None:
        """Llama 3's per-frequency divisors (llama.cpp stores them as rope_freqs.weight), or None."""
        if "rope_freqs.weight" not in self.tensors:
            return None
        return np.array(self.tensors["rope_freqs.weight"].data, dtype=np.float64).reshape(-1)

    def inv_freq(self) -> np.ndarray:
        """float64 [head_dim / 2]: the rotary frequencies, as transformers computes them."""
        c = self.config
        inv = 1.0 / (c.rope_theta ** (np.arange(0, c.head_dim, 2, dtype=np.float64) / c.head_dim))
        factors = self.rope_factors()
        return inv / factors if factors is not None else inv


def layer_names(i: int) -> dict[str, str]:
    p = f"blk.{i}."
    return {k: p + v for k, v in (
        ("attn_norm", "attn_norm.weight"), ("q", "attn_q.weight"), ("k", "attn_k.weight"), ("v", "attn_v.weight"),
        ("q_bias", "attn_q.bias"), ("k_bias", "attn_k.bias"), ("v_bias", "attn_v.bias"),
        ("o", "attn_output.weight"), ("ffn_norm", "ffn_norm.weight"), ("gate", "ffn_gate.weight"),
        ("up", "ffn_up.weight"), ("down", "ffn_down.weight"))}
