"""How often retrieval's first passage comes from the page a question names (`pages` in a venue's
questions.jsonl), per embedding model: the measurement behind docs/kiosk.md's choice of embedder.

    python tests/helpers/retrieval.py tests/data/venues/kyoto-garden --bundle qwen-coder \
        --embedder multilingual-e5-small --embedder all-minilm-l6-v2 --embedder none

Questions the pages do not answer (`expect` empty) are left out. Prints one line per venue and model
(hits of the answerable, split by the question's `lang` when it has one) and each miss."""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path


def top1(venue: Path, bundle: str, embedder: str) -> dict:
    """{"hits": Counter by lang, "total": Counter by lang, "misses": [(id, expected, got)], "seconds"}."""
    from tokenizers import Tokenizer

    from edgespec.knowledge.answer import tokenizer_sha256
    from edgespec.knowledge.embedder import load_embedder
    from edgespec.knowledge.index import Index, build_index
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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("venues", nargs="+", type=Path)
    p.add_argument("--bundle", default="qwen-coder")
    p.add_argument("--embedder", action="append", default=None)
    a = p.parse_args(argv)
    for venue in a.venues:
        for emb in a.embedder or ["multilingual-e5-small"]:
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
