"""`edgespec index DOCS... -o INDEX`: a venue's documents made into an index a kiosk answers from
(edgespec/docs/index.py; docs/kiosk.md). Every file's fate is one line on stderr: what was read (format,
encoding, pages) or why it was skipped; the exit code is EXIT_SKIPPED when the index was built but some
file or folder was skipped, so a script that refreshes a kiosk's pages can tell."""
from __future__ import annotations

import argparse
import sys

EXIT_SKIPPED = 3  # the index was built (and replaced the old one) but at least one file or folder was skipped


def register(sub) -> None:
    from ...models.catalog import DEFAULT_BUNDLE

    p = sub.add_parser(
        "index", help="index a venue's documents (PDF, Word, HTML, Markdown, text) for `serve --docs` / `chat --docs`",
        description="Build a document index: passages by headings and paragraphs, BM25 over the bundle "
                    "tokenizer's tokens and (with --embedder) sentence vectors. The folder is replaced "
                    "atomically; a running server picks it up on SIGHUP or POST /v1/docs/reload. Passages of "
                    "files unchanged since the last build keep their vectors. Exit 0: every file read; "
                    f"{EXIT_SKIPPED}: built, some skipped (each on stderr, with why); 1: nothing built.")
    p.add_argument("docs", nargs="+", metavar="DOCS", help="files or folders (.pdf, .docx, .html, .md, .txt)")
    p.add_argument("-o", "--output", required=True, metavar="INDEX", help="the index folder to write")
    p.add_argument("--bundle", default=DEFAULT_BUNDLE,
                   help=f"the bundle that will serve it (its tokenizer; default {DEFAULT_BUNDLE})")
    p.add_argument("--embedder", default="auto", metavar="MODEL|DIR",
                   help="sentence-embedding model for dense retrieval (a pulled name or an embedder folder), or "
                        "'none' for BM25 alone; default auto: all-MiniLM-L6-v2 when pulled (`edgespec pull minilm`); "
                        "pages or visitors in several languages: multilingual-e5-small (`edgespec pull multilingual-e5-small`)")
    p.add_argument("--max-chars", type=int, default=None, metavar="N", help="characters a passage holds at most")
    p.add_argument("--whole-venue", action="store_true", help="answer with every passage in the cache: prefilled "
                   "once when the server starts, a visitor's turn prefills only the question (fast first token; "
                   "needs the venue under 8,192 tokens; docs/kiosk.md compares the two)")
    p.add_argument("--cached-passages", action="store_true", help="compute every passage's cache rows once when "
                   "the server starts; a visitor's turn copies the ones retrieval picks and prefills only the question "
                   "(a first token 9x sooner, but each passage read apart from the others: the 1.5B held about half "
                   "the facts; docs/kiosk.md compares the three readings)")
    p.add_argument("--keep-flagged", action="store_true", help="keep the lines that address an assistant instead of "
                   "a visitor (by default they are left out of the index; each is a warning either way: "
                   "edgespec/docs/injection.py)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tokenizers import Tokenizer

    from ...errors import BundleNotFound
    from ...docs.answer import tokenizer_sha256
    from ...docs.documents import read_documents
    from ...docs.index import DEFAULT_MAX_CHARS, build_index
    from ...models.bundle import not_found_message, resolve_bundle

    if args.whole_venue and args.cached_passages:
        from ...errors import InvalidRequest

        raise InvalidRequest("--whole-venue and --cached-passages are two ways to read the venue: choose one",
                             param="cached-passages")
    root = resolve_bundle(args.bundle)
    if root.name == "manifest.json":
        root = root.parent
    if not (root / "tokenizer.json").is_file():
        raise BundleNotFound(not_found_message(args.bundle))
    tok = Tokenizer.from_file(str(root / "tokenizer.json"))
    reading = read_documents(args.docs)  # the documents' own errors first, before any word about the embedder
    for d in reading.documents:
        print(f"read {d.source}: {d.note}", file=sys.stderr)
    for path, why in reading.skipped:
        print(f"skipped {path}: {why}", file=sys.stderr)
    from ...docs.injection import screen

    # a page's orders to the model: warned about, and left out unless --keep-flagged
    reading, flags = screen(reading, strict=not args.keep_flagged)
    for f in flags:
        print(f"warning: {f.message()}{' (kept: --keep-flagged)' if args.keep_flagged else ' (left out)'}",
              file=sys.stderr)
    emb = _embedder(args.embedder)
    b = build_index(reading, args.output, tok, tokenizer_sha256(root), emb,
                    max_chars=args.max_chars or DEFAULT_MAX_CHARS, tokenizer_from=root.resolve().name,
                    whole_venue=args.whole_venue, cached=args.cached_passages)
    if b.reuse:
        print(f"edgespec index: every passage embedded anew: {b.reuse}", file=sys.stderr)
    vectors = f", {b.embedded} embedded ({b.reused} kept from the old index)" if emb is not None else ""
    print(f"indexed {b.documents} document(s) into {b.path}: {b.chunks} passages, {b.tokens} tokens{vectors}, "
          f"{len(b.skipped)} skipped, {b.seconds:.1f} s")
    return EXIT_SKIPPED if b.skipped else 0


def _embedder(spec: str):
    """--embedder: auto (the default embedding model when pulled, else BM25 alone, said on stderr), none, or one."""
    from ...docs.embedder import load_embedder
    from ...docs.embedder_folder import EmbedderError

    if spec in ("none", ""):
        return None
    if spec == "auto":
        try:
            return load_embedder(None)
        except EmbedderError as e:
            print(f"edgespec index: no embedding model ({e}): indexing for BM25 alone", file=sys.stderr)
            return None
    return load_embedder(spec)
