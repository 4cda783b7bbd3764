"""Quantization quality the way llama.cpp measures it (its `perplexity --kl-divergence`): a fixed text
in chunks of `chunk` tokens, each chunk run from an empty cache by the GGUF's own numpy forward pass
(native/reference.py, float32 over gguf's dequantization) and by each exported graph; over the second
half of every chunk (the first half is context), per position:

- KL(reference || graph) of the next-token distributions: mean and 99th percentile;
- top-1 agreement (llama.cpp's "same top p");
- the perplexity of the text's next tokens under the graph and under the reference.

Streaming: one chunk's [chunk, vocab] log-probabilities at a time (never [tokens, vocab]); the
reference runs once per chunk for every graph measured. The text (QUALITY_TEXT): the GNU GPL v3 and
the Apache License 2.0, verbatim (both permit verbatim copies): ~9,700 Qwen2.5 tokens of legal prose
no form here was tuned on. Run:

    python -m edgespec_export.quality MODEL.gguf BUNDLE [--role target] [--graph NAME=PATH.onnx ...]
           [--tokens 8192] [--chunk 512]

(--graph: more graphs of the same model and flavor, e.g. other export forms, measured in the same pass
against the same reference.)
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Sequence

import numpy as np

from .parity import log_softmax

DEFAULT_CHUNK = 512  # llama.cpp's default context for perplexity runs
DEFAULT_TOKENS = 8192


def quality_text() -> str:
    return resources.files("edgespec_export").joinpath("data", "quality-text.txt").read_text(encoding="utf-8")


@dataclass
class Tally:
    """Running sums of one graph over the scored positions (the per-position KLs kept for the percentile:
    one float each)."""

    kl: list[float] = field(default_factory=list)
    same_top1: int = 0
    nll: float = 0.0

    def add(self, ref: np.ndarray, got: np.ndarray, nxt: np.ndarray) -> None:
        """ref, got: log-probs [P, V] of the same positions; nxt [P]: the text's next tokens."""
        self.kl.extend(np.maximum((np.exp(ref) * (ref - got)).sum(axis=1), 0.0).tolist())
        self.same_top1 += int((ref.argmax(axis=1) == got.argmax(axis=1)).sum())
        self.nll += float(-got[np.arange(len(nxt)), nxt].sum())

    def summary(self, ref_nll: float) -> dict:
        n = len(self.kl)
        kl = np.asarray(self.kl)
        return {"positions": n, "mean_kld": round(float(kl.mean()), 6), "kld_p99": round(float(np.percentile(kl, 99)), 5),
                "max_kld": round(float(kl.max()), 4), "same_top1": round(self.same_top1 / n, 4),
                "ppl": round(math.exp(self.nll / n), 4), "ppl_reference": round(math.exp(ref_nll / n), 4),
                "ln_ppl_ratio": round((self.nll - ref_nll) / n, 5)}


def measure(gguf: Path, graphs: dict[str, tuple[Path, object]], ids: Sequence[int], usable: int, *,
            chunk: int = DEFAULT_CHUNK, progress=None) -> dict[str, dict]:
    """{name: summary} of each graph (path, its ModelFacts) against the GGUF's numpy forward pass over
    the whole chunks of `ids` (a partial last chunk is left out, as llama.cpp does)."""
    from edgespec.engine.build import load_runner

    from .native.gguf_model import GGUFModel
    from .native.reference import reference_logprobs

    if chunk < 4:
        raise ValueError(f"chunk must be at least 4 tokens, got {chunk}")
    n_chunks = len(ids) // chunk
    if n_chunks == 0:
        raise ValueError(f"{len(ids)} tokens make no chunk of {chunk}")
    gg = GGUFModel(gguf)
    runners = {name: load_runner(Path(p), facts, max_len=chunk + 1) for name, (p, facts) in graphs.items()}
    tallies = {name: Tally() for name in graphs}
    ref_nll = 0.0
    first = chunk // 2
    for c in range(n_chunks):
        cid = list(ids[c * chunk:(c + 1) * chunk])
        nxt = np.asarray(cid[first + 1:])  # positions first .. chunk-2 predict these
        ref = reference_logprobs(gg, cid, usable)[first:chunk - 1]  # [P, usable]
        ref_nll += float(-ref[np.arange(len(nxt)), nxt].sum())
        for name, runner in runners.items():
            runner.reset()
            logits = runner.step(cid, n_logits=chunk)
            got = log_softmax(np.array(logits[first:chunk - 1, :usable], dtype=np.float32))
            tallies[name].add(ref, got, nxt)
            del got
        del ref
        if progress is not None:
            progress(c + 1, n_chunks)
    return {name: t.summary(ref_nll) for name, t in tallies.items()}


def format_table(results: dict[str, dict]) -> str:
    rows = ["| form | mean KLD | KLD p99 | same top-1 | PPL (reference) | ln(PPL / PPL ref) |", "|---|---|---|---|---|---|"]
    for name, r in results.items():
        rows.append(f"| {name} | {r['mean_kld']:.5f} | {r['kld_p99']:.4f} | {r['same_top1']:.4f} | "
                    f"{r['ppl']:.4f} ({r['ppl_reference']:.4f}) | {r['ln_ppl_ratio']:+.5f} |")
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    from edgespec.models.bundle import Bundle

    p = argparse.ArgumentParser(prog="python -m edgespec_export.quality", description=__doc__.split("\n\n")[0])
    p.add_argument("gguf", type=Path, help="the GGUF the bundle's model was exported from (the reference)")
    p.add_argument("bundle", type=Path)
    p.add_argument("--role", default="target", choices=("target", "draft"))
    p.add_argument("--graph", action="append", default=[], metavar="NAME=PATH",
                   help="another graph of the same model and flavor to measure in the same pass")
    p.add_argument("--tokens", type=int, default=DEFAULT_TOKENS, help=f"tokens of the text (default {DEFAULT_TOKENS})")
    p.add_argument("--chunk", type=int, default=DEFAULT_CHUNK, help=f"tokens a chunk (default {DEFAULT_CHUNK})")
    a = p.parse_args(argv)
    b = Bundle.open(a.bundle)
    facts = b.manifest.models[a.role]
    graphs = {"bundle": (b.model_path(a.role), facts)}
    for spec in a.graph:
        name, sep, path = spec.partition("=")
        if not sep or not name or not Path(path).is_file():
            p.error(f"--graph {spec!r}: NAME=PATH of an existing .onnx file")
        graphs[name] = (Path(path), replace(facts, path=str(path)))
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(a.bundle / "tokenizer.json"))
    usable = b.manifest.tokenizer.usable_vocab
    ids = [i for i in tok.encode(quality_text(), add_special_tokens=False).ids if i < usable][:a.tokens]
    res = measure(a.gguf, graphs, ids, usable, chunk=a.chunk,
                  progress=lambda i, n: print(f"chunk {i}/{n}", file=sys.stderr, flush=True))
    for name, r in res.items():
        print(json.dumps({"form": name, **r}))
    print(format_table(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
