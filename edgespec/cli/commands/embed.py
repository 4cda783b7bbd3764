"""`edgespec embed TEXT...`: sentence embeddings from the embedding model `edgespec pull minilm` exported,
one JSON line per text (stdin's lines when no TEXT is given), for scripts and for checking a kiosk's index."""
from __future__ import annotations

import argparse
import json
import sys


def register(sub) -> None:
    p = sub.add_parser("embed", help="sentence embeddings of texts, one JSON line each",
                       description="Embed texts with a sentence-embedding model (default all-minilm-l6-v2, after "
                       "`edgespec pull minilm`): one JSON line per text with its index, token count, whether it was "
                       "truncated (texts longer than the model's max_tokens, 256 for MiniLM, keep their head) and "
                       "the L2-normalised vector. Without TEXT, each line of stdin is a text.")
    p.add_argument("texts", nargs="*", metavar="TEXT", help="texts to embed (default: the lines of stdin)")
    p.add_argument("--embedder", metavar="NAME|DIR", default=None,
                   help="an embedding model's name (see `edgespec models`) or an embedder folder (default all-minilm-l6-v2)")
    p.add_argument("--threads", type=int, default=None, help="onnxruntime threads (default: its own)")
    p.add_argument("--no-vector", action="store_true", help="counts only (tokens, truncated), no vector")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ...errors import InvalidRequest
    from ...docs.embedder import load_embedder

    texts = list(args.texts) if args.texts else [ln.rstrip("\r\n") for ln in sys.stdin]
    if not texts:
        raise InvalidRequest("nothing to embed: give TEXT arguments or lines on stdin")
    if args.threads is not None and args.threads < 1:
        raise InvalidRequest(f"--threads must be >= 1, got {args.threads}")
    emb = load_embedder(args.embedder, threads=args.threads)
    out = emb.encode(texts)
    for i, v in enumerate(out.vectors):
        row = {"index": i, "model": emb.model_id, "tokens": out.tokens[i], "truncated": out.truncated[i]}
        if not args.no_vector:
            row["embedding"] = [round(float(x), 7) for x in v]
        print(json.dumps(row))
    return 0
