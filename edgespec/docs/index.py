"""The document index: a folder built once from a venue's documents, read by a server that answers from it.

    build_index(["pages/"], "venue.idx", tokenizer, tokenizer_sha256, embedder)   # edgespec index
    idx = Index.open("venue.idx", tokenizer, tokenizer_sha256, embedder)          # checked like a bundle
    hits = idx.search("when does the museum open?", 5)                            # -> [Hit], best first

Two retrievers over the same chunks (documents.py), ranked together by a convex combination of their
normalised scores (LEX_WEIGHT x BM25 / its best + the rest x the cosine min-max scaled; Bruch et al.,
"An Analysis of Fusion Functions for Hybrid Retrieval", 2023): BM25 over the serving model's
tokenizer's tokens of the lowercased text (any language the model reads, no word splitter), and,
when the index was built with an embedding model (docs/embedder.py's Embedder), the cosine of
unit vectors. Reciprocal-rank fusion was measured first and lost a question on the test venue:
it throws away how far BM25's best passage leads (4.0 against 1.0 for "Which bus goes to the
museum?", whose passage all-MiniLM-L6-v2 ranked 12th). How well the
best passage matches, which decides whether a question is answered at all (answer.py), is read from
absolute scores, not ranks: `coverage` (the share of the question's IDF weight that the passage's
tokens hold, 0..1) and `cosine`.

The folder, like a bundle, lists every file with its size and sha256 in manifest.json, with the
embedding model and tokenizer that built it, the chunk settings and counts; opening it checks all of
that (and that the arrays agree with the counts) and refuses with one line what does not hold. It
is written into a temporary folder beside the target and renamed into place, so a reader sees the
old index or the new one, never half of one (a reader checks every file against its manifest too).

Rebuilding over an index reuses its vectors: a passage whose embedded text (title and passage) is
exactly one the old index holds, built by the same embedding model, keeps its vector, so after one
page changed only that page's passages go through the model. The old index is used only when it
checks out against its manifest (sizes and sha256), else every passage is embedded and `Built.reuse`
says why.

Files (n chunks, T tokens in all):
    chunks.jsonl      n lines {source, title, start, end, text}
    lex.npy           int32 (T_lex,)  the lowercased chunks' token ids, concatenated (BM25)
    lex_offsets.npy   int64 (n + 1,)  chunk i's lex tokens: lex[lex_offsets[i]:lex_offsets[i+1]]
    ids.npy           int32 (T,)      the chunks' token ids as written (the docs drafter's text)
    ids_offsets.npy   int64 (n + 1,)
    vectors.npy       float32 (n, dim) unit vectors (only with an embedding model)
"""
from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import InvalidRequest
from ..models.bundlefiles import file_problems, read_json, stray_problems
from ..models.files import sha256_file
from .documents import Chunk, Reading, check_unchanged, chunk_all, read_documents
from .scripts import language_basis, neutral, script_of
from .normalize import for_matching

FORMAT = "edgespec-index"
VERSION = 1
DEFAULT_MAX_CHARS = 700  # a passage: about 150-200 tokens of English, a few paragraphs under one heading
LEX_WEIGHT = 0.6  # BM25's share of the fused score; the test venue's answerable questions found their
# fact in the first passage at 0.5 and 0.7 alike (10 of 10), at 0.3 and with ranks fused 9 of 10
BM25_K1, BM25_B = 1.2, 0.75
# A question's tokens whose id is under this are left out of its lexical match: byte-level BPE
# vocabularies (Qwen2.5, Llama 3, SmolLM2) number tokens in merge order, so the first ids are the
# training text's commonest pieces in every language it holds (punctuation, " the", " is", " what",
# " how much", "?"), which say nothing about which passage answers and, absent from a venue's pages,
# would count as words the pages lack. Measured on Qwen2.5's tokenizer (151,665 ids): every question
# word of the test venue's questions is under 2000, every venue noun above it; taken as a share of the
# vocabulary (SmolLM2's 49,152: ~650), so a small tokenizer keeps its words.
COMMON_SHARE = 1 / 75
ARRAYS = ("lex.npy", "lex_offsets.npy", "ids.npy", "ids_offsets.npy")


class IndexUnusable(InvalidRequest):
    """An index folder that cannot be served (missing, lying, built for another model): one line."""

    def __init__(self, message: str):
        super().__init__(message, param="docs")


@dataclass(frozen=True)
class Hit:
    chunk: int  # row in the index
    score: float  # fused score (0..1): orders hits, means nothing alone
    coverage: float  # share of the question's IDF weight this passage holds, 0..1
    cosine: float | None  # the embedding model's cosine (None: an index without one)


@dataclass
class Built:
    path: Path
    documents: int
    chunks: int
    tokens: int
    skipped: list[tuple[str, str]]
    seconds: float
    embedded: int = 0  # passages that went through the embedding model
    reused: int = 0  # passages whose vector came from the old index at `path`
    reuse: str = ""  # why the old index's vectors were not used ("" when they were, or nothing was embedded)


# -- building -----------------------------------------------------------------------------------------
def lex_tokens(tokenizer, text: str) -> list[int]:
    """The tokens BM25 counts: the text lowercased, its whitespace one space, a space in front (so a
    first word is the same token as the word mid-sentence)."""
    return tokenizer.encode(" " + " ".join(text.lower().split()), add_special_tokens=False).ids


def _concat(seqs: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(s) for s in seqs])
    flat = np.fromiter((t for s in seqs for t in s), dtype=np.int32, count=int(offsets[-1]))
    return flat, offsets


def build_index(paths, out, tokenizer, tokenizer_sha256: str, embedder=None, *,
                max_chars: int = DEFAULT_MAX_CHARS, tokenizer_from: str = "", whole_venue: bool = False,
                cached: bool = False) -> Built:
    """Reads, chunks, tokenizes and embeds the documents and writes the index folder `out`
    atomically (see the module docstring). `paths`: files and folders, or a Reading already made
    (the CLI reads first, so a folder's own error comes before any notice about the embedding model).
    Raises IndexInputError (documents.py) for documents that cannot make an index; skipped files are
    in the result."""
    if isinstance(max_chars, bool) or not isinstance(max_chars, int) or not 100 <= max_chars <= 20000:
        raise IndexUnusable(f"chunk size must be 100 to 20000 characters, got {max_chars!r}")
    t0 = time.monotonic()
    out = Path(out)
    reading: Reading = paths if isinstance(paths, Reading) else read_documents(paths)
    chunks = chunk_all(reading.documents, max_chars)
    texts = [embedded_text(c.title, c.text) for c in chunks]
    lex = [lex_tokens(tokenizer, t) for t in texts]
    ids = [tokenizer.encode(c.text, add_special_tokens=False).ids for c in chunks]
    vectors, reused, why = None, 0, ""
    if embedder is not None:
        vectors = np.zeros((len(texts), embedder.dim), np.float32)
        old, why = old_vectors(out, embedder)
        todo = [i for i, t in enumerate(texts) if t not in old]
        for i, t in enumerate(texts):
            if t in old:
                vectors[i] = old[t]
        reused = len(texts) - len(todo)
        if todo:
            got = np.asarray(embedder.embed([texts[i] for i in todo]), dtype=np.float32)
            if got.shape != (len(todo), embedder.dim):
                raise IndexUnusable(f"embedding model {embedder.model_id} returned shape {got.shape}, "
                                    f"expected ({len(todo)}, {embedder.dim})")
            vectors[todo] = got
    check_unchanged(reading.documents)  # after the slow part: a file edited meanwhile is caught

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.building-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        with open(tmp / "chunks.jsonl", "w", encoding="utf-8") as f:
            for c in chunks:
                f.write(json.dumps({"source": c.source, "title": c.title, "start": c.start, "end": c.end,
                                    "text": c.text}, ensure_ascii=False) + "\n")
        arrays = dict(zip(ARRAYS, (*_concat(lex), *_concat(ids))))
        if vectors is not None:
            arrays["vectors.npy"] = vectors
        for name, a in arrays.items():
            np.save(tmp / name, a, allow_pickle=False)
        files = {p.name: {"size": p.stat().st_size, "sha256": sha256_file(p)} for p in sorted(tmp.iterdir())}
        manifest = {
            "format": FORMAT, "version": VERSION,
            "embedder": None if embedder is None else {"model_id": embedder.model_id, "dim": int(embedder.dim)},
            "tokenizer": {"sha256": tokenizer_sha256, "from": tokenizer_from},
            "chunking": {"max_chars": max_chars},
            "reading": "whole" if whole_venue else "cached" if cached else "passages",  # how a turn reads the venue (docs/answer.py)
            "counts": {"documents": len(reading.documents), "chunks": len(chunks), "tokens": int(sum(map(len, ids)))},
            "documents": [{"source": d.source, "title": d.title, "size": d.size, "sha256": d.sha256, "read": d.note}
                          for d in reading.documents],
            "skipped": [{"source": p, "why": w} for p, w in reading.skipped],
            "files": files,
        }
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False), encoding="utf-8")
        _replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Built(out, len(reading.documents), len(chunks), manifest["counts"]["tokens"], reading.skipped,
                 time.monotonic() - t0, 0 if vectors is None else len(chunks) - reused, reused, why)


def old_vectors(path: Path, embedder) -> tuple[dict[str, np.ndarray], str]:
    """({embedded text: its vector} from the index at `path`, "") when it was built by this embedding model
    and checks out against its manifest, else ({}, why not; "" when there is no index there)."""
    if not (path / "manifest.json").is_file():
        return {}, ""
    try:
        m = read_manifest(path)
        if (m.get("embedder") or {}).get("model_id") != embedder.model_id:
            return {}, f"the old index was built with {(m.get('embedder') or {}).get('model_id') or 'no embedding model'}"
        problems = file_problems(path, m["files"], True, sha256_file)
        if problems:
            return {}, f"the old index does not match its manifest ({problems[0]})"
        rows = [json.loads(line) for line in (path / "chunks.jsonl").read_text("utf-8").splitlines()]
        v = np.load(path / "vectors.npy", allow_pickle=False)
    except (IndexUnusable, ValueError, TypeError, OSError, KeyError, AttributeError) as e:
        return {}, f"the old index is unreadable ({str(e)[:120]})"
    if v.shape != (len(rows), embedder.dim) or v.dtype != np.float32:
        return {}, f"the old index's vectors are {v.shape}, not one per passage of {embedder.dim}"
    return {embedded_text(r["title"], r["text"]): v[i] for i, r in enumerate(rows)}, ""


def embedded_text(title: str, text: str) -> str:
    """What a passage's vector and lexical tokens are made from: its title and text, as matching reads them
    (normalize.py); the key by which a rebuild finds a passage's vector in the old index."""
    return for_matching(f"{title}\n{text}")


def _replace_dir(new: Path, dest: Path) -> None:
    """`new` takes `dest`'s place: a rename when dest is absent, else dest moved aside first (two
    renames; a reader between them finds no index and keeps the one it has, never half of one)."""
    if dest.exists() and not (dest / "manifest.json").is_file():
        raise IndexUnusable(f"{dest} exists and is not an index (no manifest.json): not replaced")
    if not dest.exists():
        os.rename(new, dest)
        return
    old = dest.parent / f".{dest.name}.old-{os.getpid()}"
    shutil.rmtree(old, ignore_errors=True)
    os.rename(dest, old)
    os.rename(new, dest)
    shutil.rmtree(old, ignore_errors=True)


# -- reading ------------------------------------------------------------------------------------------
def read_manifest(path: Path) -> dict:
    if not path.is_dir():
        raise IndexUnusable(f"index {path} does not exist: build it with `edgespec index DOCS... -o {path}`")
    m, why = read_json(path / "manifest.json")
    if why is not None:
        raise IndexUnusable(f"index {path}: {why}")
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise IndexUnusable(f"index {path}: manifest.json is not an edgespec index's")
    if m.get("version") != VERSION:
        raise IndexUnusable(f"index {path}: format version {m.get('version')!r}, this edgespec reads {VERSION}: "
                          "rebuild it with `edgespec index`")
    files, counts = m.get("files"), m.get("counts")
    if (not isinstance(files, dict) or not all(isinstance(v, dict) and isinstance(v.get("size"), int)
                                               and isinstance(v.get("sha256"), str) for v in files.values())
            or not isinstance(counts, dict) or not isinstance(counts.get("chunks"), int)):
        raise IndexUnusable(f"index {path}: manifest.json lacks its files or counts")
    return m


def _embedder_check(path: Path, m: dict, embedder) -> None:
    built = (m.get("embedder") or {}).get("model_id") if isinstance(m.get("embedder"), dict) else None
    serving = getattr(embedder, "model_id", None)
    if built != serving:
        raise IndexUnusable(f"index {path} was built with embedding model {built or 'none'}, served with "
                          f"{serving or 'none'}: rebuild it with `edgespec index --embedder {serving or 'none'}` "
                          f"or serve it with {built or 'no embedding model'}")


class Index:
    """An index folder loaded and checked (see the module docstring); search() is thread-safe (reads only)."""

    def __init__(self, path: Path, manifest: dict, chunks: list[Chunk], arrays: dict[str, np.ndarray],
                 tokenizer, embedder):
        self.path = path
        self.manifest = manifest
        self.chunks = chunks
        self.tokenizer = tokenizer
        self.embedder = embedder
        self.ids, self.ids_offsets = arrays["ids.npy"], arrays["ids_offsets.npy"]
        self.vectors = arrays.get("vectors.npy")
        # passages in several scripts: the embedding's language directions taken out, and the vectors alone rank
        # (BM25 only matches a question's own language: docs/scripts.py)
        self._basis = None if self.vectors is None else language_basis(self.vectors, [script_of(c.text) for c in chunks])
        self._neutral = None if self._basis is None else neutral(self.vectors, self._basis)
        self._common = int(tokenizer.get_vocab_size() * COMMON_SHARE)  # ids under it: not counted in a question
        lex, off = arrays["lex.npy"], arrays["lex_offsets.npy"]
        n = len(chunks)
        lengths = np.diff(off).astype(np.float64)  # (n,)
        self._avg = max(float(lengths.mean()) if n else 1.0, 1.0)
        self._len = lengths
        owner = np.repeat(np.arange(n, dtype=np.int64), np.diff(off))  # (T_lex,) chunk of each token
        key = lex.astype(np.int64) * n + owner  # unique (token, chunk) pairs, sorted by token then chunk
        pairs, tf = np.unique(key, return_counts=True)
        self._tok = pairs // max(n, 1)  # (P,) token of each posting, sorted
        self._chunk = pairs % max(n, 1)  # (P,) its chunk
        self._tf = tf.astype(np.float64)
        toks, df = np.unique(self._tok, return_counts=True)
        self._idf_tok = toks
        self._idf = np.log(1.0 + (n - df + 0.5) / (df + 0.5))  # BM25's idf, always > 0

    @classmethod
    def open(cls, path, tokenizer, tokenizer_sha256: str | None, embedder=None) -> "Index":
        """Loads and checks the index folder (module docstring); tokenizer_sha256 (None: not checked)
        must be the serving bundle's tokenizer.json's, embedder the model that built it (or None)."""
        path = Path(path)
        m = read_manifest(path)
        problems = file_problems(path, m["files"], True, sha256_file) + stray_problems(path, {*m["files"], "manifest.json"})
        if problems:
            raise IndexUnusable(f"index {path} does not match its manifest: {problems[0]}"
                              f"{f' (and {len(problems) - 1} more)' if len(problems) > 1 else ''}")
        _embedder_check(path, m, embedder)
        built_tok = (m.get("tokenizer") or {}).get("sha256") if isinstance(m.get("tokenizer"), dict) else None
        if tokenizer_sha256 is not None and built_tok != tokenizer_sha256:
            raise IndexUnusable(f"index {path} was built with another tokenizer ({(m.get('tokenizer') or {}).get('from') or 'unknown'}"
                              "): rebuild it with `edgespec index --bundle` naming the bundle it serves")
        try:
            chunks = [Chunk(**json.loads(line)) for line in (path / "chunks.jsonl").read_text("utf-8").splitlines()]
            arrays = {name: np.load(path / name, allow_pickle=False) for name in m["files"] if name.endswith(".npy")}
        except (ValueError, TypeError, OSError, UnicodeDecodeError) as e:
            raise IndexUnusable(f"index {path}: unreadable ({type(e).__name__}: {str(e)[:120]})") from None
        _check_arrays(path, m, chunks, arrays, embedder)
        return cls(path, m, chunks, arrays, tokenizer, embedder)

    # -- queries -----------------------------------------------------------------------------------
    def chunk_ids(self, i: int) -> np.ndarray:
        return self.ids[self.ids_offsets[i] : self.ids_offsets[i + 1]]

    def bm25(self, query: str) -> tuple[np.ndarray, np.ndarray]:
        """(scores (n,), coverage (n,)): BM25 of every chunk for the question's tokens (the commonest
        ids left out, COMMON_SHARE), and the share of their idf weight each chunk holds, a token no chunk holds
        weighing as one only one chunk holds would (how coverage sees what the pages lack)."""
        n = len(self.chunks)
        scores, held = np.zeros(n), np.zeros(n)
        q = np.unique(np.asarray(lex_tokens(self.tokenizer, query), dtype=np.int64))
        q = q[q >= self._common]
        j = np.searchsorted(self._idf_tok, q)
        known = (j < len(self._idf_tok)) & (self._idf_tok[np.minimum(j, len(self._idf_tok) - 1)] == q)
        total = 0.0
        for t, jj, ok in zip(q, j, known):
            if not ok:
                total += float(np.log(1.0 + (n - 0.5) / 1.5))
                continue
            idf = self._idf[jj]
            total += idf
            lo, hi = np.searchsorted(self._tok, [t, t + 1])
            c, tf = self._chunk[lo:hi], self._tf[lo:hi]
            scores[c] += idf * tf * (BM25_K1 + 1) / (tf + BM25_K1 * (1 - BM25_B + BM25_B * self._len[c] / self._avg))
            held[c] += idf
        return scores, held / total if total > 0 else held

    def search(self, query: str, k: int = 8) -> list[Hit]:
        """The k best chunks for `query`, best first (fused scores; module docstring)."""
        n = len(self.chunks)
        if n == 0 or not query.strip():
            return []
        query = for_matching(query)  # look-alike forms match as the plain text does (normalize.py)
        lex, coverage = self.bm25(query)
        fused = lex / lex.max() if lex.max() > 0 else lex
        cos = None
        if self.vectors is not None and self.embedder is not None:
            embed = getattr(self.embedder, "embed_query", self.embedder.embed)  # E5: "query: " against "passage: "
            qv = np.asarray(embed([query]), dtype=np.float32).reshape(-1)
            cos = self.vectors @ qv  # (n,)
            ranked = cos if self._basis is None else self._neutral @ neutral(qv[None], self._basis)[0]
            spread = float(ranked.max() - ranked.min())
            dense = (ranked - ranked.min()) / spread if spread > 0 else 0 * ranked
            fused = LEX_WEIGHT * fused + (1 - LEX_WEIGHT) * dense if self._basis is None else dense
        top = [int(i) for i in np.argsort(-fused, kind="stable")[:k] if fused[i] > 0]
        return [Hit(i, float(fused[i]), float(coverage[i]), None if cos is None else float(cos[i])) for i in top]


def _check_arrays(path: Path, m: dict, chunks: list[Chunk], a: dict[str, np.ndarray], embedder) -> None:
    """The arrays agree with each other and the manifest's counts (a folder whose checksums were
    rewritten to fit changed files is still caught when its parts disagree)."""
    n = len(chunks)
    lie = None
    if n != m["counts"]["chunks"]:
        lie = f"{n} chunks, manifest says {m['counts']['chunks']}"
    elif any(name not in a for name in ARRAYS):
        lie = f"missing {', '.join(x for x in ARRAYS if x not in a)}"
    else:
        for name in ("lex", "ids"):
            flat, off = a[f"{name}.npy"], a[f"{name}_offsets.npy"]
            if (flat.ndim != 1 or off.shape != (n + 1,) or off[0] != 0 or off[-1] != len(flat)
                    or np.any(np.diff(off) < 0) or not np.issubdtype(flat.dtype, np.integer)):
                lie = f"{name}.npy and its offsets do not cut it into {n} chunks"
                break
            if len(flat) and (flat.min() < 0 or flat.max() >= 1 << 24):
                lie = f"{name}.npy holds token ids out of any vocabulary's range"
                break
        v = a.get("vectors.npy")
        dim = (m.get("embedder") or {}).get("dim") if isinstance(m.get("embedder"), dict) else None
        if lie is None and (v is None) != (dim is None):
            lie = "vectors.npy and the manifest's embedding model disagree"
        elif lie is None and v is not None and (v.shape != (n, dim) or v.dtype != np.float32 or
                                                (embedder is not None and dim != embedder.dim)):
            lie = f"vectors.npy is {v.shape} {v.dtype}, expected ({n}, {dim}) float32"
    if lie is not None:
        raise IndexUnusable(f"index {path} is inconsistent: {lie}; rebuild it with `edgespec index`")
