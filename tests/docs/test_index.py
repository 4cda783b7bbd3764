"""The index folder: built, searched, checked like a bundle, replaced atomically."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from edgespec.docs.documents import IndexInputError
from edgespec.docs.index import Index, IndexUnusable, build_index
from edgespec.models.files import sha256_file

from helpers.venue import QUESTIONS, VENUE, FakeEmbedder


@pytest.fixture()
def built(tmp_path, words):
    tok, sha = words
    build_index([VENUE], tmp_path / "venue.idx", tok, sha, tokenizer_from="words")
    return tmp_path / "venue.idx"


def test_build_writes_a_manifest_with_sizes_checksums_and_settings(built, words):
    m = json.loads((built / "manifest.json").read_text())
    assert m["format"] == "edgespec-index" and m["embedder"] is None and m["chunking"] == {"max_chars": 700}
    assert m["tokenizer"] == {"sha256": words[1], "from": "words"}
    assert m["counts"]["documents"] == 6 and m["counts"]["chunks"] >= 12
    assert set(m["files"]) == {"chunks.jsonl", "lex.npy", "lex_offsets.npy", "ids.npy", "ids_offsets.npy"}
    for name, entry in m["files"].items():
        assert entry == {"size": (built / name).stat().st_size, "sha256": sha256_file(built / name)}
    assert not [p for p in built.parent.iterdir() if p.name.startswith(".")]  # no temporary folder left


def test_every_answerable_question_finds_its_fact_in_the_top_passages(built, words):
    idx = Index.open(built, words[0], words[1])
    for line in QUESTIONS.read_text().splitlines():
        q = json.loads(line)
        if q.get("unanswerable"):
            continue
        hits = idx.search(q["q"], 3)
        assert any(all(f in idx.chunks[h.chunk].text for f in q["facts"]) for h in hits), q


def test_coverage_separates_answerable_from_unanswerable(built, words):
    """The decline decision's number (docs/answer.py MIN_COVERAGE sits between these)."""
    from edgespec.docs.answer import MIN_COVERAGE

    idx = Index.open(built, words[0], words[1])
    best = {}
    for line in QUESTIONS.read_text().splitlines():
        q = json.loads(line)
        best[q["q"]] = (max((h.coverage for h in idx.search(q["q"], 8)), default=0.0), q.get("unanswerable", False))
    answerable = [c for c, u in best.values() if not u]
    unanswerable = [c for c, u in best.values() if u]
    assert min(answerable) >= MIN_COVERAGE > max(unanswerable), best


def test_dense_vectors_rank_with_bm25_and_record_the_model(tmp_path, words):
    emb = FakeEmbedder()
    build_index([VENUE], tmp_path / "d.idx", words[0], words[1], emb)
    m = json.loads((tmp_path / "d.idx" / "manifest.json").read_text())
    assert m["embedder"] == {"model_id": "fake-embedder/bow", "dim": 64} and "vectors.npy" in m["files"]
    idx = Index.open(tmp_path / "d.idx", words[0], words[1], emb)
    hits = idx.search("fish soup price", 3)
    assert hits[0].cosine is not None and -1.0 <= hits[0].cosine <= 1.0
    assert "fish soup" in idx.chunks[hits[0].chunk].text
    assert np.allclose(np.linalg.norm(idx.vectors, axis=1), 1.0, atol=1e-5)


def test_an_index_of_another_embedding_model_or_tokenizer_is_refused(tmp_path, built, words):
    build_index([VENUE], tmp_path / "d.idx", words[0], words[1], FakeEmbedder())
    with pytest.raises(IndexUnusable, match=r"built with embedding model fake-embedder/bow, served with other/v2"):
        Index.open(tmp_path / "d.idx", words[0], words[1], FakeEmbedder("other/v2"))
    with pytest.raises(IndexUnusable, match=r"built with embedding model fake-embedder/bow, served with none"):
        Index.open(tmp_path / "d.idx", words[0], words[1], None)
    with pytest.raises(IndexUnusable, match=r"built with embedding model none, served with fake-embedder/bow"):
        Index.open(built, words[0], words[1], FakeEmbedder())
    with pytest.raises(IndexUnusable, match=r"built with another tokenizer \(words\): rebuild it"):
        Index.open(built, words[0], "0" * 64)


def _rewrite_manifest(path, **changes):
    m = json.loads((path / "manifest.json").read_text())
    m.update(changes)
    (path / "manifest.json").write_text(json.dumps(m))
    return m


@pytest.mark.parametrize("lie, message", [
    ("edit", r"chunks.jsonl: sha256 .* does not match the manifest's"),
    ("truncate", r"ids.npy: size \d+ bytes, manifest says \d+"),
    ("stray", r"notes.txt: present but not listed in the manifest"),
    ("missing", r"lex.npy: missing"),
    ("counts", r"inconsistent: \d+ chunks, manifest says 999"),
    ("offsets", r"inconsistent: ids.npy and its offsets do not cut it into \d+ chunks"),
    ("manifest", r"manifest.json: unreadable JSON"),
    ("format", r"manifest.json is not an edgespec index's"),
])
def test_an_index_folder_that_lies_is_refused_with_one_line(built, words, lie, message):
    if lie == "edit":
        f = built / "chunks.jsonl"
        f.write_text(f.read_text().replace("11:00", "12:00"))
    elif lie == "truncate":
        f = built / "ids.npy"
        f.write_bytes(f.read_bytes()[:-8])
    elif lie == "stray":
        (built / "notes.txt").write_text("x")
    elif lie == "missing":
        (built / "lex.npy").unlink()
    elif lie == "counts":
        _rewrite_manifest(built, counts={"documents": 6, "chunks": 999, "tokens": 1})
    elif lie == "offsets":  # rewritten with checksums that fit: the arrays themselves disagree
        off = np.load(built / "ids_offsets.npy")
        off[-1] += 5
        np.save(built / "ids_offsets.npy", off)
        m = json.loads((built / "manifest.json").read_text())
        m["files"]["ids_offsets.npy"] = {"size": (built / "ids_offsets.npy").stat().st_size,
                                         "sha256": sha256_file(built / "ids_offsets.npy")}
        (built / "manifest.json").write_text(json.dumps(m))
    elif lie == "manifest":
        (built / "manifest.json").write_text("{not json")
    elif lie == "format":
        _rewrite_manifest(built, format="something-else")
    with pytest.raises(IndexUnusable, match=message) as e:
        Index.open(built, words[0], words[1])
    assert "\n" not in str(e.value)


def test_a_missing_index_says_how_to_build_one(tmp_path, words):
    with pytest.raises(IndexUnusable, match=r"does not exist: build it with `edgespec index DOCS... -o"):
        Index.open(tmp_path / "nothing", words[0], words[1])


def test_a_rebuild_replaces_the_folder_whole_and_refuses_to_replace_a_non_index(tmp_path, built, words):
    tok, sha = words
    before = Index.open(built, tok, sha)
    extra = tmp_path / "more"
    extra.mkdir()
    (extra / "shop.md").write_text("# Shop\n\nThe museum shop sells brass compasses for 25 euros.\n")
    build_index([VENUE, extra], built, tok, sha)
    after = Index.open(built, tok, sha)
    assert len(after.chunks) == len(before.chunks) + 1
    assert [c.title for c in after.chunks if "compasses" in c.text] == ["Shop"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["more", "venue.idx"]  # nothing left aside
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "precious.txt").write_text("keep me")
    with pytest.raises(IndexUnusable, match="exists and is not an index .*not replaced"):
        build_index([VENUE], tmp_path / "mine", tok, sha)
    assert (tmp_path / "mine" / "precious.txt").read_text() == "keep me"


def test_a_file_changed_during_indexing_leaves_no_index(tmp_path, words):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# A\n\nThe gallery opens at nine.\n")

    class Editing(FakeEmbedder):
        def embed(self, texts):
            (docs / "a.md").write_text("# A\n\nThe gallery opens at ten now.\n")
            return super().embed(texts)

    with pytest.raises(IndexInputError, match="a.md changed while it was indexed"):
        build_index([docs], tmp_path / "x.idx", words[0], words[1], Editing())
    assert not (tmp_path / "x.idx").exists() and sorted(os.listdir(tmp_path)) == ["docs"]
