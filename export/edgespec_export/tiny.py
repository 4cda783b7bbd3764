"""Tiny random models with a real byte-level tokenizer, for tests and for `doctor`-style smoke runs.

They go through the same export path as real models, so a test on them tests the exporter, the
bundle format and the runtime together, in seconds. Random weights make greedy output repetitive,
which n-gram drafting likes; `seed` changes the weights so a "draft" that disagrees can be built.
"""
from __future__ import annotations

import json
from pathlib import Path

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TINY_ARCHS = ("qwen2", "llama", "mistral", "qwen3")

_CORPUS = """
def add(a, b):
    return a + b

def greet(name):
    print(f"Hello, {name}!")

class Stack:
    def __init__(self):
        self.items = []
    def push(self, x):
        self.items.append(x)
    def pop(self):
        return self.items.pop()

The quick brown fox jumps over the lazy dog. Speculative decoding drafts a few tokens and the
target model checks them all in one pass. Edge devices have little memory and a power budget.
Grüße aus München, naïve café, 東京, Привет мир, emoji 🙂 and ✓ marks.
for i in range(10): total += i * i  # squares
""" * 4


def make_tokenizer(out_dir: Path, vocab_size: int = 400) -> Path:
    """Trains a byte-level BPE (every byte encodable, so any unicode text round-trips) on a fixed
    corpus and writes tokenizer.json + tokenizer_config.json with a ChatML template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    out_dir.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_CORPUS], trainer=trainer)
    tok.save(str(out_dir / "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "add_bos_token": False,
        "chat_template": CHATML_TEMPLATE,
        "model_max_length": 512,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    (out_dir / "special_tokens_map.json").write_text(
        json.dumps({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, indent=2)
    )
    return out_dir / "tokenizer.json"


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


def _llama_permute(w, n_head: int, n_head_kv: int | None = None):
    """The row order llama.cpp stores llama Q/K weights in (its rotary kernel pairs adjacent rows)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def make_tiny_gguf(hf_dir: str | Path, out_path: str | Path, *, qtype: str = "Q8_0", pre: str = "qwen2",
                   add_bos: bool = False, name: str = "tiny") -> Path:
    """Writes a tiny HF model (from make_tiny_model) as a GGUF file the way llama.cpp lays one out:
    GGUF tensor names, llama Q/K rows permuted, matrices in `qtype` (F32, F16 or Q8_0), norms in F32,
    a "gpt2" tokenizer whose vocabulary is padded to the logits rows with UNUSED "[PADn]" tokens."""
    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    hf_dir, out_path = Path(hf_dir), Path(out_path)
    cfg = json.loads((hf_dir / "config.json").read_text())
    arch = cfg["model_type"]
    gguf_arch = {"mistral": "llama"}.get(arch, arch)
    arch_id = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == gguf_arch)
    names = gguf.get_tensor_name_map(arch_id, cfg["num_hidden_layers"])
    weights = {}
    for f in sorted(hf_dir.glob("*.safetensors")):
        weights.update(load_file(f))
    w = gguf.GGUFWriter(out_path, gguf_arch)
    w.add_name(name)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_freq_base(float(cfg.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    if arch == "qwen3":
        w.add_key_length(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])
        w.add_value_length(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if qtype == "Q8_0" else gguf.LlamaFileType.ALL_F32)
    add_gguf_tokenizer(w, hf_dir, cfg["vocab_size"], pre=pre, add_bos=add_bos)
    # tensors
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    for hf_name, arr in weights.items():
        base, suffix = hf_name.rsplit(".", 1)
        gname = names.get_name(base)
        if gname is None:
            continue
        arr = np.ascontiguousarray(arr.astype(np.float32))
        if gguf_arch == "llama" and base.endswith("q_proj"):
            arr = _llama_permute(arr, heads, heads)
        elif gguf_arch == "llama" and base.endswith("k_proj"):
            arr = _llama_permute(arr, heads, kv)
        full = f"{gname}.{suffix}"
        if arr.ndim == 2 and qtype == "Q8_0" and arr.shape[1] % 32 == 0:
            q = gguf.quants.quantize(arr, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(full, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        elif arr.ndim == 2 and qtype == "F16":
            w.add_tensor(full, arr.astype(np.float16))
        else:
            w.add_tensor(full, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out_path


def add_gguf_tokenizer(w, tok_dir: Path, rows: int, *, pre: str = "qwen2", add_bos: bool = False) -> None:
    """The tokenizer of `tok_dir` (make_tokenizer's) as llama.cpp writes one into a GGUF: a "gpt2" BPE
    whose vocabulary is padded to the logits rows with UNUSED "[PADn]" tokens."""
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


def make_bad_gguf(out_path: str | Path, *, arch: str = "llama", tensor_type: str = "F32") -> Path:
    """A GGUF with one tensor and minimal metadata, for the refusal tests: an architecture we do not
    support, or a tensor type nothing can dequantize (e.g. Q8_K, llama.cpp's internal type)."""
    import gguf
    import numpy as np

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
