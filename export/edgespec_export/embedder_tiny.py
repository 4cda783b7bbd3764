"""A tiny random BERT in the layout the embedding export reads (model.zip: config.json, model.safetensors,
tokenizer.json), for tests: a WordPiece tokenizer over a few hundred pieces, 2 layers, 32 wide."""
from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path

import numpy as np

WORDS = ("the museum station opens closes at in on and or of to a is are for hours ticket tickets price "
         "child children adult free cafe floor lift platform train tour guided photo room hall desk lost "
         "property monday tuesday wednesday thursday friday saturday sunday summer winter morning evening "
         "nine ten six seven eight euro euros what when where how much many").split()


def tokenizer_json() -> str:
    """A BERT-style WordPiece tokenizer (lowercasing, [CLS] text [SEP]) over WORDS, letters and digits."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    chars = list("abcdefghijklmnopqrstuvwxyz0123456789.,?!'-:;()")
    pieces = specials + chars + ["##" + c for c in chars if c.isalnum()] + list(WORDS)
    vocab = {p: i for i, p in enumerate(dict.fromkeys(pieces))}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    return tok.to_str()


def safetensors_bytes(tensors: dict[str, np.ndarray]) -> bytes:
    names = {np.dtype(np.float32): "F32", np.dtype(np.int64): "I64"}
    header, blobs, offset = {}, [], 0
    for name, a in tensors.items():
        raw = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": names[a.dtype], "shape": list(a.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def make_tiny_bert(out: str | Path, *, hidden: int = 32, layers: int = 2, heads: int = 4, intermediate: int = 64,
                   positions: int = 64, seed: int = 0, prefix: str = "") -> Path:
    """Writes model.zip at `out` (a random BERT whose vectors still differ from text to text)."""
    tok = tokenizer_json()
    vocab = len(json.loads(tok)["model"]["vocab"])
    rng = np.random.default_rng(seed)
    r = lambda *shape: (rng.standard_normal(shape) * 0.2).astype(np.float32)  # noqa: E731
    t: dict[str, np.ndarray] = {
        "embeddings.word_embeddings.weight": r(vocab, hidden),
        "embeddings.position_embeddings.weight": r(positions, hidden),
        "embeddings.token_type_embeddings.weight": r(2, hidden),
        "embeddings.LayerNorm.weight": 1 + r(hidden), "embeddings.LayerNorm.bias": r(hidden),
        "embeddings.position_ids": np.arange(positions, dtype=np.int64)[None],
    }
    for i in range(layers):
        p = f"encoder.layer.{i}."
        for name, (o, n) in {"attention.self.query": (hidden, hidden), "attention.self.key": (hidden, hidden),
                             "attention.self.value": (hidden, hidden), "attention.output.dense": (hidden, hidden),
                             "intermediate.dense": (intermediate, hidden), "output.dense": (hidden, intermediate)}.items():
            t[p + name + ".weight"], t[p + name + ".bias"] = r(o, n), r(o)
        for ln in ("attention.output.LayerNorm", "output.LayerNorm"):
            t[p + ln + ".weight"], t[p + ln + ".bias"] = 1 + r(hidden), r(hidden)
    config = {"architectures": ["BertModel"], "model_type": "bert", "hidden_act": "gelu", "hidden_size": hidden,
              "num_hidden_layers": layers, "num_attention_heads": heads, "intermediate_size": intermediate,
              "max_position_embeddings": positions, "vocab_size": vocab, "layer_norm_eps": 1e-12,
              "type_vocab_size": 2, "pad_token_id": 0}
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(out, "w") as zf:
        zf.writestr("config.json", json.dumps(config))
        zf.writestr("model.safetensors", safetensors_bytes({prefix + k: v for k, v in t.items()}))
        zf.writestr("tokenizer.json", tok)
    return out
