"""What the suffix index costs: insertion per token and lookup time at a small and a large history.

    python -m edgespec.bench.suffix_cost [--tokens 1048576] [--small 1024]

The history is this package's own source and docs as word/punctuation ids, repeated up to the size
asked (real text with real repeats, no tokenizer needed); the lookups are contexts taken from that
text. Printed, not asserted: timings on a shared machine only say something side by side, and the
claim they check is that lookup time does not grow with the history (docs/speed.md).
"""
from __future__ import annotations

import argparse
import re
import time
from pathlib import Path

import numpy as np

from ..drafters.suffix_index import SuffixIndex


def corpus(n: int) -> np.ndarray:
    root = Path(__file__).resolve().parents[1]
    ids: dict[str, int] = {}
    words: list[int] = []
    for f in sorted(root.rglob("*.py")) + sorted(root.rglob("*.md")):
        words += [ids.setdefault(w, len(ids)) for w in re.findall(r"\w+|[^\w\s]", f.read_text())]
    return np.resize(np.asarray(words, dtype=np.int64), n)


def lookup_seconds(idx: SuffixIndex, text: np.ndarray, n: int = 2000, seed: int = 0) -> float:
    """Median seconds of one 8-token lookup of a 32-token context ending somewhere in `text`."""
    rng = np.random.default_rng(seed)
    ends = rng.integers(32, len(text), n)
    times = []
    for e in ends:
        tail = text[e - 32 : e].tolist()
        t0 = time.perf_counter()
        idx.lookup(tail, 8)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def scan_seconds(text: np.ndarray, n: int = 200, seed: int = 0) -> float:
    """Median seconds of the old index's first step alone: every position of the context's last token."""
    rng = np.random.default_rng(seed)
    a = text.astype(np.int32)
    times = []
    for e in rng.integers(32, len(text), n):
        t0 = time.perf_counter()
        np.flatnonzero(a == a[e - 1])
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=1 << 20, help="the large history (default 1M tokens)")
    ap.add_argument("--small", type=int, default=1024, help="the small history")
    args = ap.parse_args(argv)
    text = corpus(args.tokens)
    print(f"{'history':>10} {'insert us/token':>16} {'lookup us':>10} {'old scan of last token us':>26} "
          f"{'states':>9} {'MB':>7}")
    for n in (args.small, args.tokens):
        idx = SuffixIndex(capacity=max(16, n))
        t0 = time.perf_counter()
        idx.extend(text[:n])
        ins = (time.perf_counter() - t0) / n
        look = lookup_seconds(idx, text[:n])
        print(f"{n:>10} {ins * 1e6:>16.1f} {look * 1e6:>10.1f} {scan_seconds(text[:n]) * 1e6:>26.1f} "
              f"{idx.states:>9} {idx.nbytes / 1e6:>7.1f}")


if __name__ == "__main__":
    main()
