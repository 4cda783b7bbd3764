"""Writing systems in a venue's passages, and the part of a multilingual embedding that only says which.

A multilingual sentence embedding (multilingual-e5-small) places a Japanese question nearer to every
Japanese passage than to the English one that answers it: the vectors carry the language as well as the
meaning. Where an index holds passages in more than one script, the directions between the scripts' mean
passage vectors are taken out of every passage and question vector (projected away) before cosines are
compared: "language-neutral" vectors in the sense of Libovický et al., "On the Language Neutrality of
Pre-trained Multilingual Representations" (2020), who remove each language's centroid. Measured on
tests/data/venues/kyoto-garden (English and Japanese pages, each asked about in the other language), top-1
page 13 of 24 without, 19 with (the centroids themselves: 17); checked on tests/data/venues/heldout-lisbon,
which chose nothing: 7 of 16 without, 11 with.

Script, not language: English and Portuguese pages share the Latin script and are one group here.
"""
from __future__ import annotations

import unicodedata

import numpy as np

MIN_GROUP = 2  # passages a script needs before its mean vector says anything
_SCRIPTS = {"CJK": "CJK", "HIRAGANA": "CJK", "KATAKANA": "CJK", "HALFWIDTH": "CJK", "FULLWIDTH": "CJK",
            "HANGUL": "HANGUL", "CYRILLIC": "CYRILLIC", "GREEK": "GREEK", "ARABIC": "ARABIC", "HEBREW": "HEBREW",
            "THAI": "THAI", "DEVANAGARI": "DEVANAGARI", "LATIN": "LATIN"}


def script_of(text: str) -> str:
    """The script most of the text's letters are written in ("LATIN", "CJK" for Chinese characters and kana,
    "CYRILLIC", ...; "" when it has no letters)."""
    counts: dict[str, int] = {}
    for ch in text:
        if ch.isalpha():
            s = _SCRIPTS.get(unicodedata.name(ch, "?").split(" ")[0], "OTHER")
            counts[s] = counts.get(s, 0) + 1
    return max(counts, key=counts.get) if counts else ""


def language_basis(vectors: np.ndarray, scripts: list[str]) -> np.ndarray | None:
    """Orthonormal rows spanning the differences between the scripts' mean vectors (scripts with at least
    MIN_GROUP passages), or None when fewer than two scripts have that many: nothing to take out."""
    groups = sorted({s for s in scripts if s and scripts.count(s) >= MIN_GROUP})
    if len(groups) < 2:
        return None
    labels = np.asarray(scripts)
    means = np.stack([vectors[labels == g].mean(0) for g in groups]).astype(np.float64)
    q, r = np.linalg.qr((means[1:] - means[0]).T)  # [dim, groups - 1]
    keep = np.abs(np.diag(r)) > 1e-6
    return q[:, keep].T.astype(np.float32) if keep.any() else None


def neutral(x: np.ndarray, basis: np.ndarray) -> np.ndarray:
    """x [n, dim] with the basis' directions taken out, each row of unit length again."""
    y = x - (x @ basis.T) @ basis
    return y / np.maximum(np.linalg.norm(y, axis=-1, keepdims=True), 1e-12)
