"""The tiny models' tokenizer: a real byte-level BPE (any unicode text round-trips) trained on a fixed
corpus, with a ChatML template. tiny.py's Hugging Face models and native/tiny_gguf.py's GGUF files carry it.
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
