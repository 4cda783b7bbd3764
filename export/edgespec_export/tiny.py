"""Tiny random models with a real byte-level tokenizer, for tests and for `doctor`-style smoke runs.

They go through the same export path as real models, so a test on them tests the exporter, the
bundle format and the runtime together, in seconds. Random weights make greedy output repetitive,
which n-gram drafting likes; `seed` changes the weights so a "draft" that disagrees can be built.
"""
from __future__ import annotations

import json
from pathlib import Path

from .tiny_tokenizer import make_tokenizer

TINY_ARCHS = ("qwen2", "llama", "mistral", "qwen3")


def make_tiny_model(
    out_dir: str | Path,
    *,
    arch: str = "qwen2",
    seed: int = 0,
    layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    vocab_size: int = 512,
    max_positions: int = 512,
    tokenizer_vocab: int = 400,
    tied: bool = False,
) -> Path:
    """Writes a Hugging Face folder (config, safetensors, tokenizer) with random weights.

    `vocab_size` > `tokenizer_vocab` on purpose: the extra logits rows are padding, as in real
    Qwen checkpoints, so tests cover the usable-range logic. `tied` shares the embedding with the
    lm_head (SmolLM2, Qwen2.5-0.5B/1.5B do)."""
    import torch
    from transformers import (
        LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM,
        Qwen3Config, Qwen3ForCausalLM,
    )

    out_dir = Path(out_dir)
    torch.manual_seed(seed)
    common = dict(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=tied,
        bos_token_id=None,
        eos_token_id=2,
        pad_token_id=0,
    )
    if arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    elif arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    elif arch == "mistral":
        model = MistralForCausalLM(MistralConfig(**common, sliding_window=None))
    elif arch == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(**common, head_dim=hidden // heads))
    else:
        raise ValueError(f"tiny models come in {', '.join(TINY_ARCHS)}, not {arch!r}")
    # Random init gives near-uniform logits; a larger (untied) lm_head makes them peaked, like a
    # trained model's, so near-ties are rare and greedy text is varied but with some repetition.
    if not tied:  # scaling a tied head would scale the embedding too: every token predicts itself
        with torch.no_grad():
            model.lm_head.weight.mul_(30.0)
    model.save_pretrained(out_dir, safe_serialization=True)
    make_tokenizer(out_dir, tokenizer_vocab)
    return out_dir


def make_tiny_draft(target_dir: str | Path, out_dir: str | Path, *, noise: float, seed: int = 1) -> Path:
    """A draft that is the target plus Gaussian noise of relative size `noise` on every weight:
    small noise gives a draft that agrees often, large noise one that disagrees often."""
    import torch
    from transformers import AutoModelForCausalLM

    target_dir, out_dir = Path(target_dir), Path(out_dir)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(target_dir)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * p.std().clamp_min(1e-3) * noise)
    model.save_pretrained(out_dir, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (out_dir / f).write_bytes((target_dir / f).read_bytes())
    return out_dir


def make_tiny_gguf(hf_dir: str | Path, out_path: str | Path, *, qtype: str = "Q8_0", pre: str = "qwen2",
                   add_bos: bool = False, name: str = "tiny") -> Path:
    """Writes a tiny HF model (from make_tiny_model) as a GGUF file the way llama.cpp lays one out
    (native/tiny_gguf.write_gguf): GGUF tensor names, llama Q/K rows permuted, matrices in `qtype` (F32,
    F16 or Q8_0), norms in F32, a "gpt2" tokenizer whose vocabulary is padded to the logits rows with
    UNUSED "[PADn]" tokens."""
    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    from .native.tiny_gguf import llama_permute, write_gguf

    hf_dir = Path(hf_dir)
    cfg = json.loads((hf_dir / "config.json").read_text())
    arch = cfg["model_type"]
    gguf_arch = {"mistral": "llama"}.get(arch, arch)
    arch_id = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == gguf_arch)
    names = gguf.get_tensor_name_map(arch_id, cfg["num_hidden_layers"])
    weights = {}
    for f in sorted(hf_dir.glob("*.safetensors")):
        weights.update(load_file(f))
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]

    def tensors():
        for hf_name, arr in weights.items():
            base, suffix = hf_name.rsplit(".", 1)
            gname = names.get_name(base)
            if gname is None:
                continue
            arr = np.ascontiguousarray(arr.astype(np.float32))
            if gguf_arch == "llama" and base.endswith("q_proj"):
                arr = llama_permute(arr, heads)
            elif gguf_arch == "llama" and base.endswith("k_proj"):
                arr = llama_permute(arr, kv)
            matrix = arr.ndim == 2 and (qtype != "Q8_0" or arr.shape[1] % 32 == 0)
            yield f"{gname}.{suffix}", arr, qtype if matrix else "F32"

    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    return write_gguf(
        out_path, gguf_arch, tensors(), layers=cfg["num_hidden_layers"], context=cfg["max_position_embeddings"],
        hidden=cfg["hidden_size"], ffn=cfg["intermediate_size"], heads=heads, kv_heads=kv, vocab=cfg["vocab_size"],
        name=name, tok_dir=hf_dir, rope_base=cfg.get("rope_theta", 10000.0), rms_eps=cfg["rms_norm_eps"],
        head_dim=head_dim if arch == "qwen3" else None, pre=pre, add_bos=add_bos,
        file_type=gguf.LlamaFileType.MOSTLY_Q8_0 if qtype == "Q8_0" else gguf.LlamaFileType.ALL_F32)
