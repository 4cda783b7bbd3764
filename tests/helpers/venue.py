"""Shared by the document tests (docs/, the lossless row): a word-level tokenizer ordered like a BPE vocabulary (the
commonest words first, docs/index.py COMMON_SHARE), a fake embedding model, and the test venue."""
from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np

VENUE = Path(__file__).parent.parent / "docs" / "venue"
QUESTIONS = VENUE.parent / "venue_questions.jsonl"
COMMON = ("the a an is are was were be to of in on at for and or not no do does did can i you it this that "
          "what when where which who how much many why there their from by with as its my me we time day "
          "goes go cost costs ? . , ! : ; - ' \" ( ) /").split()


def make_word_tokenizer(out: Path):
    """A WordLevel tokenizer: COMMON's words at the lowest ids, filler ids, then every word of the test
    venue and its questions (any other word is [UNK], id 0)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    words = set()
    for f in [*VENUE.iterdir(), QUESTIONS]:
        words.update(re.findall(r"\w+|[^\w\s]", f.read_text("utf-8").lower()))
    words.update(["ignore", "instructions", "pirate", "previous", "say"])
    vocab = {"[UNK]": 0}
    for w in COMMON:
        vocab.setdefault(w, len(vocab))
    while len(vocab) < 6000:  # COMMON_SHARE of the vocabulary covers COMMON and no venue word
        vocab[f"filler{len(vocab)}"] = len(vocab)
    for w in sorted(words - set(vocab)):
        vocab[w] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    tok.normalizer = normalizers.Lowercase()
    path = out / "tokenizer.json"
    tok.save(str(path))
    return Tokenizer.from_file(str(path)), hashlib.sha256(path.read_bytes()).hexdigest()


class FakeEmbedder:
    """Bag-of-hashed-words unit vectors: texts sharing words point the same way (tests only)."""

    def __init__(self, model_id: str = "fake-embedder/bow", dim: int = 64):
        self.model_id = model_id
        self.dim = dim
        self.calls = 0

    def embed(self, texts: list[str]) -> np.ndarray:
        self.calls += 1
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            for w in re.findall(r"\w+", t.lower()):
                out[i, int(hashlib.md5(w.encode()).hexdigest(), 16) % self.dim] += 1.0
        n = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.maximum(n, 1e-9)
