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
) -> Path:
    """Writes a Hugging Face folder (config, safetensors, tokenizer) with random weights.

    `vocab_size` > `tokenizer_vocab` on purpose: the extra logits rows are padding, as in real
    Qwen checkpoints, so tests cover the usable-range logic."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

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
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=2,
        pad_token_id=0,
    )
    if arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    elif arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        raise ValueError(f"tiny models come in qwen2 and llama, not {arch!r}")
    # Random init gives near-uniform logits; a larger (untied) lm_head makes them peaked, like a
    # trained model's, so near-ties are rare and greedy text is varied but with some repetition.
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
