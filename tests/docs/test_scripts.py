"""Passages in two scripts: the embedding's language direction is taken out before cosines rank them,
so a question finds the page in the other language that answers it."""
from __future__ import annotations

import numpy as np

from edgespec.docs.index import Index, build_index
from edgespec.docs.scripts import language_basis, neutral, script_of

# one "meaning" dimension per concept, spelled in either language
CONCEPTS = {"ticket": 1, "price": 1, "入場料": 1, "料金": 1, "parking": 2, "car": 2, "駐車場": 2, "車": 2,
            "lift": 3, "wheelchair": 3, "エレベーター": 3, "車椅子": 3, "cafe": 4, "coffee": 4, "喫茶": 4, "コーヒー": 4}


class BilingualEmbedder:
    """Meaning plus a strong language direction (dimension 0 for Japanese), as a multilingual model's vectors
    carry both; question and passage vectors alike."""

    model_id, dim = "fake-bilingual/1", 8

    def embed(self, texts):
        out = np.zeros((len(texts), self.dim), np.float32)
        for i, t in enumerate(texts):
            for word, dim in CONCEPTS.items():
                out[i, dim] += t.count(word)
            out[i, 0] += 3.0 if script_of(t) == "CJK" else 0.0
            out[i, 7] += 0.5  # something every text shares
        return out / np.linalg.norm(out, axis=1, keepdims=True)


def test_script_of_is_the_script_most_letters_are_in():
    assert script_of("入場料は800円です (adults)") == "CJK"
    assert script_of("Café à Lisboa, 9 €") == "LATIN"
    assert script_of("Музей открыт") == "CYRILLIC"
    assert script_of("12:00 - 13:00") == ""


def test_no_basis_for_one_script_and_the_basis_removes_the_difference_of_means():
    v = np.eye(4, dtype=np.float32)
    assert language_basis(v, ["LATIN"] * 4) is None
    assert language_basis(v, ["LATIN", "LATIN", "LATIN", "CJK"]) is None  # one CJK passage says nothing
    b = language_basis(v, ["LATIN", "LATIN", "CJK", "CJK"])
    assert b.shape == (1, 4) and np.isclose(np.linalg.norm(b), 1.0)
    n = neutral(v, b)
    assert np.allclose(n @ b.T, 0, atol=1e-6) and np.allclose(np.linalg.norm(n, axis=1), 1.0)


def test_a_question_finds_the_page_in_the_other_language(tmp_path, words):
    pages = tmp_path / "pages"
    pages.mkdir()
    (pages / "tickets.md").write_text("# Tickets\n\nThe ticket price for adults is 800 yen.\n")
    (pages / "cafe.md").write_text("# Cafe\n\nThe cafe serves coffee from ten.\n")
    (pages / "lift.md").write_text("# Access\n\nThe lift takes a wheelchair.\n")
    (pages / "ryokin.md").write_text("# 料金\n\n入場料は800円です。\n", encoding="utf-8")
    (pages / "parking.md").write_text("# 駐車場\n\n駐車場は車20台です。\n", encoding="utf-8")
    (pages / "access.md").write_text("# バリアフリー\n\n車椅子とエレベーターがあります。\n", encoding="utf-8")
    emb = BilingualEmbedder()
    build_index([pages], tmp_path / "i.idx", words[0], words[1], emb)
    idx = Index.open(tmp_path / "i.idx", words[0], words[1], emb)

    def top(q):
        return idx.chunks[idx.search(q, 1)[0].chunk].source.rsplit("/", 1)[-1]

    assert top("喫茶でコーヒーは飲めますか") == "cafe.md"  # Japanese question, only an English page answers
    assert top("Where can I park my car?") == "parking.md"  # English question, only a Japanese page answers
    assert top("How much is a ticket?") == "tickets.md" and top("入場料はいくら") == "ryokin.md"
    # the raw cosines send the Japanese question about the cafe to a Japanese page
    raw = idx.vectors @ emb.embed(["喫茶でコーヒーは飲めますか"])[0]
    assert script_of(idx.chunks[int(np.argmax(raw))].text) == "CJK"
