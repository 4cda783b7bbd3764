"""Measuring what a plan predicted: an engine opened as a user would, its caches filled to the worst
case, RSS read before and after. Lives above the engine (it opens one); the plan's arithmetic lives
in edge/memory.py.

    python -m edgespec.engine.measure BUNDLE --max-len N [--no-draft] [--no-fill]   -> one JSON line
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np

from ..units import measure_rss
from .engine import Engine


def measure_engine(bundle, *, max_len: int, load_draft: bool, fill: bool = True, providers=None,
                   threads: int | None = None, root: str = "/", unified: bool | None = None) -> dict[str, int]:
    """Opens an Engine the way a user would (in this process), fills every KV cache to max_len in
    prefill chunks (the worst case a budget must hold), and returns RSS numbers in bytes:
    {"after_load", "peak", "baseline", "pid"}. Device memory (edge/gpumem.py) is read before the
    engine exists, so the CUDA context is in the delta: "device_used_delta" (NVML: the device's free
    memory that went), or on a unified-memory board (a Jetson) "shared_used_delta" (MemAvailable that
    went: host and device together) with "device_used_delta" the part beyond the RSS growth; where
    neither can be read, "device_note" says why. Run it in a fresh process (`measure_fresh`): the
    peak RSS of a process that already did other work says nothing about this plan."""
    from ..edge import gpumem

    rd = gpumem.reader(root, unified=unified)
    free0 = rd.free() if rd is not None else None  # before any CUDA call: the context is not there yet
    baseline = measure_rss().get("rss", 0)
    eng = Engine.open(bundle, draft="auto" if load_draft else "ngram", max_len=max_len, providers=providers,
                      threads=threads, verify=False)
    after_load = measure_rss().get("rss", 0)
    if fill:
        rng = np.random.default_rng(0)
        chunk = eng.plan_chunk  # the chunk a prompt read alone is read in
        for runner in (eng.target, eng.draft_runner):
            if runner is None:
                continue
            runner.reset()
            vocab = min(runner.vocab_size, eng.bundle.manifest.tokenizer.usable_vocab)
            while runner.length < runner.max_len:
                n = min(chunk, runner.max_len - runner.length)
                runner.step(rng.integers(0, vocab, size=n).tolist(), 1)
            runner.reset()
    peak = measure_rss().get("peak", 0)
    free1 = rd.free() if rd is not None else None
    eng.close()
    out: dict = {"baseline": baseline, "after_load": after_load, "peak": peak, "pid": os.getpid()}
    if free0 is not None and free1 is not None:
        went = max(0, free0 - free1)
        if rd.unified:
            out["shared_used_delta"] = went
            out["device_used_delta"] = max(0, went - (peak - baseline))
        else:
            out["device_used_delta"] = went
        out["device_reader"] = rd.name
    else:
        out["device_note"] = gpumem.why_not(root)
    return out


def measure_fresh(bundle_path: str | os.PathLike, *, max_len: int, load_draft: bool, fill: bool = True,
                  providers=None, threads: int | None = None, timeout: float = 1800) -> dict[str, int]:
    """`measure_engine` in a new Python process, so the peak RSS belongs to this plan alone."""
    argv = [sys.executable, "-m", "edgespec.engine.measure", str(bundle_path), "--max-len", str(max_len)]
    if not load_draft:
        argv.append("--no-draft")
    if not fill:
        argv.append("--no-fill")
    if providers:
        argv += ["--providers", providers if isinstance(providers, str) else ",".join(providers)]
    if threads:
        argv += ["--threads", str(threads)]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if p.returncode != 0:
        raise RuntimeError(f"memory measurement failed ({p.returncode}): {p.stderr.strip()[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m edgespec.engine.measure")
    ap.add_argument("bundle")
    ap.add_argument("--max-len", type=int, required=True)
    ap.add_argument("--no-draft", action="store_true")
    ap.add_argument("--no-fill", action="store_true")
    ap.add_argument("--providers", default=None)
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args(argv)
    out = measure_engine(a.bundle, max_len=a.max_len, load_draft=not a.no_draft, fill=not a.no_fill,
                         providers=a.providers, threads=a.threads)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
