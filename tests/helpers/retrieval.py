"""How often retrieval's first passage comes from the page a question names (`pages` in a venue's
questions.jsonl), per embedding model: the measurement behind docs/kiosk.md's choice of embedder.

    python tests/helpers/retrieval.py tests/data/venues/kyoto-garden --bundle qwen-coder \
        --embedder multilingual-e5-small --embedder all-minilm-l6-v2 --embedder none

Questions the pages do not answer (`expect` empty) are left out. Prints one line per venue and model
(hits of the answerable, split by the question's `lang` when it has one) and each miss.

`--variants` prints instead, per venue and model, the top-1 page of each ranking tried against the index's
own for cross-language questions (docs/kiosk.md, "Pages and visitors in different languages"): BM25 fused
in, the question embedded as a passage, other ways of taking the language out, and sentence vectors
(several per passage) with their aggregation; with `--translate`, also the question translated by the
bundle's model into the other language of the venue (English for a Japanese question, else Japanese), ranked
by the translation's cosines alone and summed with the question's. The ranking that ships is the index's
search()."""
from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np


def top1(venue: Path, bundle: str, embedder: str) -> dict:
    """{"hits": Counter by lang, "total": Counter by lang, "misses": [(id, expected, got)], "seconds"}."""
    from tokenizers import Tokenizer

    from edgespec.docs.answer import tokenizer_sha256
    from edgespec.docs.embedder import load_embedder
    from edgespec.docs.index import Index, build_index
    from edgespec.models.bundle import resolve_bundle

    root = resolve_bundle(bundle)
    root = root.parent if root.name == "manifest.json" else root
    tok = Tokenizer.from_file(str(root / "tokenizer.json"))
    sha = tokenizer_sha256(root)
    emb = None if embedder == "none" else load_embedder(embedder)
    out = {"hits": Counter(), "total": Counter(), "misses": []}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        build_index([venue / "pages"], Path(tmp) / "i.idx", tok, sha, emb)
        idx = Index.open(Path(tmp) / "i.idx", tok, sha, emb)
        for line in (venue / "questions.jsonl").read_text("utf-8").splitlines():
            q = json.loads(line)
            if not q.get("expect"):
                continue
            lang = q.get("lang", "en")
            hits = idx.search(q["question"], 1)
            got = Path(idx.chunks[hits[0].chunk].source).name if hits else "(none)"
            out["total"][lang] += 1
            if got in q["pages"]:
                out["hits"][lang] += 1
            else:
                out["misses"].append((q["id"], q["pages"], got))
    out["seconds"] = time.monotonic() - t0
    return out


def _sentences(text: str) -> list[str]:
    parts = re.split(r"(?<=[。．！？!?])|(?<=[.])\s+|\n+", text)
    return [p.strip() for p in parts if len(p.strip()) > 3]


def _minmax(x: np.ndarray) -> np.ndarray:
    spread = float(x.max() - x.min())
    return (x - x.min()) / spread if spread > 0 else 0 * x


def _by_script(x: np.ndarray, scripts: list[str], fn) -> np.ndarray:
    """x with fn applied within each script's rows."""
    labels, out = np.asarray(scripts), x.astype(np.float64)
    for g in set(scripts):
        out[labels == g] = fn(out[labels == g])
    return out


def translated(venue: Path, bundle: str) -> tuple[list[str], float]:
    """The answerable questions translated by the bundle's model (greedy, 40 tokens at most), and the seconds
    each took on average."""
    from edgespec import Engine
    from edgespec.docs.scripts import script_of

    qs = [q for q in map(json.loads, (venue / "questions.jsonl").read_text("utf-8").splitlines()) if q.get("expect")]
    eng, out, t0 = Engine.open(bundle), [], time.monotonic()
    try:
        for q in qs:
            to = "English" if script_of(q["question"]) == "CJK" else "Japanese"
            out.append(eng.generate(messages=[
                {"role": "system", "content": f"Translate the visitor's question into {to}. Reply with the translation only."},
                {"role": "user", "content": q["question"]}], max_new_tokens=40, temperature=0).text.strip())
    finally:
        eng.close()
    return out, (time.monotonic() - t0) / max(len(qs), 1)


def variants(venue: Path, bundle: str, embedder: str, translations: list[str] | None = None) -> dict[str, tuple[int, int, list[str]]]:
    """{variant: (hits, questions, ["id->page got", ...])}: each ranking's first passage against the page named."""
    from tokenizers import Tokenizer

    from edgespec.docs.answer import tokenizer_sha256
    from edgespec.docs.embedder import load_embedder
    from edgespec.docs.index import Index, build_index, embedded_text
    from edgespec.docs.normalize import for_matching
    from edgespec.docs.scripts import language_basis, neutral, script_of
    from edgespec.models.bundle import resolve_bundle

    root = resolve_bundle(bundle)
    root = root.parent if root.name == "manifest.json" else root
    tok, sha, emb = Tokenizer.from_file(str(root / "tokenizer.json")), tokenizer_sha256(root), load_embedder(embedder)
    with tempfile.TemporaryDirectory() as tmp:
        build_index([venue / "pages"], Path(tmp) / "i.idx", tok, sha, emb)
        idx = Index.open(Path(tmp) / "i.idx", tok, sha, emb)
    qs = [q for q in map(json.loads, (venue / "questions.jsonl").read_text("utf-8").splitlines()) if q.get("expect")]
    texts = [for_matching(q["question"]) for q in qs]
    pages = [Path(c.source).name for c in idx.chunks]
    V, scripts = idx.vectors, [script_of(c.text) for c in idx.chunks]
    Q, Qp = emb.embed_query(texts), emb.embed(texts)  # questions as E5 asks ("query: ") and as passages
    Vq = emb.embed_query([embedded_text(c.title, c.text) for c in idx.chunks])  # passages as questions
    sents = [(i, s) for i, c in enumerate(idx.chunks) for s in _sentences(c.text)]
    owner = np.array([i for i, _ in sents])
    S = {"with titles": emb.embed([embedded_text(idx.chunks[i].title, s) for i, s in sents]),
         "without titles": emb.embed([for_matching(s) for _, s in sents])}
    s_scripts = [script_of(s) for _, s in sents]

    def neutral_cos(M, labels, q):
        b = language_basis(M, labels)
        return M @ q if b is None else neutral(M, b) @ neutral(q[None], b)[0]

    def sentence_scores(j, key, agg):
        s = neutral_cos(S[key], s_scripts, Q[j])
        return np.array([agg(np.sort(s[owner == i])) if (owner == i).any() else -9.0 for i in range(len(pages))])

    def lex_fused(j, w):
        lex = idx.bm25(texts[j])[0]
        return w * (lex / lex.max() if lex.max() > 0 else lex) + (1 - w) * _minmax(neutral_cos(V, scripts, Q[j]))

    def rrf(j, k=60):
        lex, dense = idx.bm25(texts[j])[0], neutral_cos(V, scripts, Q[j])
        rank = lambda x: np.argsort(np.argsort(-x))  # noqa: E731
        return 1 / (k + rank(dense)) + np.where(lex > 0, 1 / (k + rank(lex)), 0)

    def centroids(j):
        labels = np.asarray(scripts)
        means = {g: V[labels == g].mean(0) for g in set(scripts)}
        X = V - np.stack([means[g] for g in scripts])
        q = Q[j] - means.get(script_of(texts[j]), 0)
        return (X / np.linalg.norm(X, axis=1, keepdims=True)) @ q

    def page_mean(j):
        s = neutral_cos(V, scripts, Q[j])
        return np.array([s[[p == pages[i] for p in pages]].mean() for i in range(len(pages))])

    ranks = {
        "index search (shipped)": lambda j: [h.chunk for h in idx.search(qs[j]["question"], 1)],
        "raw cosine (no language directions out)": lambda j: V @ Q[j],
        "question embedded as a passage": lambda j: neutral_cos(V, scripts, Qp[j]),
        "script centroids subtracted": centroids,
        "cosines z-scored per script": lambda j: _by_script(neutral_cos(V, scripts, Q[j]), scripts, lambda x: (x - x.mean()) / (x.std() + 1e-9)),
        "cosines centred per script": lambda j: _by_script(neutral_cos(V, scripts, Q[j]), scripts, lambda x: x - x.mean()),
        "basis also over passages as questions": lambda j: _qbasis(V, Vq, scripts, Q[j], language_basis, neutral),
        **{f"BM25 fused, weight {w}": (lambda w: lambda j: lex_fused(j, w))(w) for w in (0.1, 0.2, 0.3, 0.5)},
        "BM25 rank-fused (RRF, k 60)": rrf,
        "page: mean of its passages": page_mean,
        **{f"sentences {key}, {name}": (lambda key, agg: lambda j: sentence_scores(j, key, agg))(key, agg)
           for key in S for name, agg in (("best", lambda x: x[-1]), ("mean of best 2", lambda x: x[-2:].mean()),
                                          ("mean", np.mean))},
        "passage and best sentence, mean": lambda j: 0.5 * neutral_cos(V, scripts, Q[j]) + 0.5 * sentence_scores(j, "with titles", lambda x: x[-1]),
        "passage or best sentence, max": lambda j: np.maximum(neutral_cos(V, scripts, Q[j]), sentence_scores(j, "with titles", lambda x: x[-1])),
    }
    if translations is not None:
        T = emb.embed_query([for_matching(t) for t in translations])
        ranks["question translated, its cosines alone"] = lambda j: neutral_cos(V, scripts, T[j])
        ranks["question and translation, min-max cosines summed"] = (
            lambda j: _minmax(neutral_cos(V, scripts, Q[j])) + _minmax(neutral_cos(V, scripts, T[j])))
    out = {}
    for name, rank in ranks.items():
        misses = []
        for j, q in enumerate(qs):
            r = rank(j)
            got = pages[r[0]] if isinstance(r, list) and r else "(none)" if isinstance(r, list) else pages[int(np.argmax(r))]
            if got not in q["pages"]:
                misses.append(f"{q['id']}->{got}")
        out[name] = (len(qs) - len(misses), len(qs), misses)
    return out


def _qbasis(V, Vq, scripts, q, language_basis, neutral):
    """Language directions from four groups: each script's passages embedded as passages and as questions."""
    b = language_basis(np.concatenate([V, Vq]), [s + "/passage" for s in scripts] + [s + "/query" for s in scripts])
    return V @ q if b is None else neutral(V, b) @ neutral(q[None], b)[0]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("venues", nargs="+", type=Path)
    p.add_argument("--bundle", default="qwen-coder")
    p.add_argument("--embedder", action="append", default=None)
    p.add_argument("--variants", action="store_true", help="each ranking tried for cross-language questions")
    p.add_argument("--translate", action="store_true", help="with --variants: also rank the questions translated "
                   "by the bundle's model (slow: a generation per question)")
    a = p.parse_args(argv)
    for venue in a.venues:
        for emb in a.embedder or ["multilingual-e5-small"]:
            if a.variants:
                tr, each = translated(venue, a.bundle) if a.translate else (None, 0.0)
                if a.translate:
                    print(f"{venue.name}: translated by {a.bundle}, {each:.1f} s a question: {' | '.join(tr)}")
                for name, (h, n, misses) in variants(venue, a.bundle, emb, tr).items():
                    print(f"{venue.name} {emb} {name}: {h}/{n} ({h / n:.0%})  {' '.join(misses)}")
                continue
            r = top1(venue, a.bundle, emb)
            n, h = sum(r["total"].values()), sum(r["hits"].values())
            langs = ", ".join(f"{lang} {r['hits'][lang]}/{r['total'][lang]}" for lang in sorted(r["total"]))
            print(f"{venue.name} {emb}: top-1 page {h}/{n} ({h / n:.0%}; {langs}), {r['seconds']:.1f} s")
            for qid, want, got in r["misses"]:
                print(f"  miss {qid}: expected {', '.join(want)}, got {got}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    sys.exit(main())
