"""How far each decode step is from the memory-bandwidth bound.

A decode step of a weight-only-quantized model on a CPU is memory-bound: every step streams all
its weights once (each token's row of the embedding aside), plus the KV cache up to the context
length, and does little arithmetic per byte. So no step can take less than

    bytes read per step / the machine's achievable read bandwidth,

and the ratio measured / bound says how much a kernel (or what runs around it) leaves on the table.
Both halves are measured here, not assumed:

- bytes: from the graph file's initializers (models/graphfacts.py reads their shapes and types, no
  weights loaded). An initializer read by a matrix product is read whole every step; one read only
  by a Gather / GatherBlockQuantized (an embedding, possibly through a Reshape) or as attention's
  rotary cos/sin cache is read one row per token. MatMulNBits' packed weights, its scales and zero points are counted apart, the lm_head
  (the product whose width is the vocabulary) apart again. The KV cache adds
  kv_bytes_per_token x context.
- bandwidth: a streaming read of a buffer much larger than the last-level cache, split over the
  engine's thread count, one numpy reduction per thread (numpy releases the GIL inside it), the best
  of a few passes: what plain loads reach on this machine with that many threads.

Prepacked kernels may keep their own copy of a weight in another layout (onnxruntime's int8-compute
MatMulNBits adds per-block sums on x86): the bound counts what the graph stores, so such extra
bytes show up as distance to the bound.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from math import prod
from pathlib import Path
from typing import Any, Sequence

# bytes per element of the initializer types a graph holds (graphfacts.ELEM_TYPES names)
ELEM_BYTES = {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0, "float64": 8.0, "int64": 8.0, "uint64": 8.0,
              "int32": 4.0, "uint32": 4.0, "int16": 2.0, "uint16": 2.0, "int8": 1.0, "uint8": 1.0, "bool": 1.0,
              "float8e4m3fn": 1.0, "int4": 0.5, "uint4": 0.5}
# inputs a node reads one row of per token: an embedding's table (and a block-quantized one's scales and
# zero points), GroupQueryAttention's rotary cos/sin caches (one row per position)
ROW_INPUTS = {"Gather": (0,), "GatherBlockQuantized": (0, 2, 3), "GroupQueryAttention": (7, 8)}
# the streaming read: 256 MiB, 8x the 32 MiB L3 of the largest CPUs we target, so the cache cannot hold it
BANDWIDTH_BUFFER = 256 << 20
BANDWIDTH_PASSES = 5  # best of 5: the first pass pays page faults, the others show the load's noise


@dataclass
class StepBytes:
    """Bytes one step of `tokens` tokens reads from a graph, by kind (the KV cache apart: it grows)."""

    weights: int = 0  # MatMulNBits packed weights, lm_head excluded
    scales: int = 0  # MatMulNBits scales and zero points, lm_head excluded
    lm_head: int = 0  # the vocabulary-wide product: its weight, scales and zero points
    embedding_rows: int = 0  # the rows `tokens` tokens read of embeddings and rotary caches
    other: int = 0  # float weights: norms, biases, unquantized products, constants
    kv_per_position: int = 0  # KV bytes each cached position adds to a step's reads
    tokens: int = 1

    @property
    def fixed(self) -> int:
        """Bytes read whatever the context: everything but the KV cache."""
        return self.weights + self.scales + self.lm_head + self.embedding_rows + self.other

    def total(self, context: int) -> int:
        """Bytes a step reads with `context` positions already in the cache."""
        return self.fixed + self.kv_per_position * max(int(context), 0)


def _nbytes(elem: str, dims: Sequence[int]) -> int:
    if elem not in ELEM_BYTES:
        raise ValueError(f"initializer element type {elem!r} has no known size")
    return int(prod(int(d) for d in dims) * ELEM_BYTES[elem] + 0.5)


def step_bytes(graph: str | Path, *, tokens: int = 1, kv_per_position: int = 0) -> StepBytes:
    """The bytes a step of `tokens` tokens reads from the graph at `graph` (its initializers; see the
    module docstring). `kv_per_position`: the model's KV bytes per cached position."""
    from ..models.graphfacts import read_graph_io

    if tokens < 1:
        raise ValueError(f"tokens must be at least 1, got {tokens}")
    io = read_graph_io(Path(graph))
    inits = io.initializer_dims
    vocab = _vocab(io)
    consumers: dict[str, list[tuple[Any, int]]] = {}
    for node in io.nodes:
        for i, name in enumerate(node.inputs):
            if name in inits:
                consumers.setdefault(name, []).append((node, i))
    reshaped = {o: n for n in io.nodes if n.op_type == "Reshape" for o in n.outputs}
    out = StepBytes(tokens=tokens, kv_per_position=int(kv_per_position))
    for name, dims in inits.items():
        nb = _nbytes(io.value_types.get(name, "float32"), dims)
        uses = consumers.get(name, [])
        if uses and all(_row_read(node, i, io, reshaped) for node, i in uses):
            rows = int(dims[0]) if dims and int(dims[0]) > 0 else 1
            out.embedding_rows += min(rows, tokens) * (nb // rows)
            continue
        nbits = [(node, i) for node, i in uses if node.op_type == "MatMulNBits" and i in (1, 2, 3)]
        if nbits:  # read whole by the product (a tied embedding also gathers rows of it: no extra bytes)
            node, i = nbits[0]
            if vocab is not None and node.ints.get("N") == vocab:
                out.lm_head += nb
            elif i == 1:
                out.weights += nb
            else:
                out.scales += nb
        else:
            out.other += nb
    return out


def _row_read(node, i: int, io, reshaped: dict) -> bool:
    """Does `node` read only the rows its token ids pick from its input i? Through a Reshape (a tied
    embedding reshapes the lm_head's tensor), the Reshape's consumers decide."""
    if node.op_type in ROW_INPUTS:
        return i in ROW_INPUTS[node.op_type] and node.ints.get("gather_axis", node.ints.get("axis", 0)) == 0
    if node.op_type == "Reshape" and i == 0:
        out = node.outputs[0]
        users = [(n, j) for n in io.nodes for j, x in enumerate(n.inputs) if x == out]
        return bool(users) and all(_row_read(n, j, io, reshaped) for n, j in users)
    return False


def _vocab(io) -> int | None:
    """The logits' width: the lm_head is the MatMulNBits whose N is this."""
    for name, t in io.outputs.items():
        if "logits" in name and t.dims and isinstance(t.dims[-1], int):
            return t.dims[-1]
    return None


def read_bandwidth(threads: int = 1, nbytes: int = BANDWIDTH_BUFFER, passes: int = BANDWIDTH_PASSES) -> float:
    """Bytes per second a streaming read reaches with `threads` threads: a buffer of `nbytes` (much
    larger than the last-level cache) split in `threads` parts, each OR-reduced by numpy in its own
    thread (the reduction runs without the GIL, vectorised, and does one load per 8 bytes, so the
    loads and not the arithmetic are what it times). The best of `passes`."""
    import numpy as np
    from concurrent.futures import ThreadPoolExecutor

    threads = max(int(threads or 1), 1)
    words = max(int(nbytes) // 8, threads)
    buf = np.ones(words, dtype=np.uint64)  # written once: every page is resident before timing
    parts = np.array_split(buf, threads)
    best = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(max(int(passes), 1)):
            t0 = time.perf_counter()
            list(pool.map(np.bitwise_or.reduce, parts))
            best = min(best, time.perf_counter() - t0)
    return buf.nbytes / best


@dataclass
class ModelBound:
    """One model's bound: its step bytes, the context the KV term is taken at, and the measured
    mean step time by tokens per step."""

    role: str
    graph: str
    bytes: dict[str, int]  # StepBytes fields for a 1-token step
    context: int
    measured_s: dict[int, float] = field(default_factory=dict)  # tokens per step -> mean seconds
    # the bytes a decode step of the source GGUF reads in llama.cpp (every tensor but the token
    # embedding), when the bundle was exported from one and recorded it; None otherwise
    source_bytes: int | None = None

    def step_total(self, tokens: int) -> int:
        b = StepBytes(**self.bytes)
        # each token reads its own embedding row (the stored figure is a 1-token step's)
        return b.fixed + b.embedding_rows * (tokens - 1) + b.kv_per_position * self.context


def bound_report(models: Sequence[ModelBound], bandwidth: float, threads: int) -> dict[str, Any]:
    """What a run stores under meta["bound"] (and report.format_bound prints)."""
    return {"bandwidth_bytes_per_s": bandwidth, "threads": threads, "models": [asdict(m) for m in models]}


def measure(engine, samples: Sequence, threads: int | None = None) -> dict[str, Any]:
    """The bound of the engine's target (and draft, if loaded) beside the steps the run's `samples`
    timed. The context is the mean position of a decode step over the target-alone samples."""
    import os

    ctxs = [s.prompt_tokens + s.new_tokens / 2 for s in samples if s.mode == "target"]
    context = int(sum(ctxs) / len(ctxs)) if ctxs else 0
    threads = threads or getattr(engine, "threads", None) or os.cpu_count() or 1
    b = engine.bundle
    models = []
    for role, key in (("target", "target_steps"), ("draft", "draft_steps")):
        if role not in b.manifest.models or (role == "draft" and getattr(engine, "draft_runner", None) is None):
            continue
        f = b.manifest.models[role]
        sb = step_bytes(b.model_path(role), kv_per_position=f.kv_bytes_per_token())
        models.append(ModelBound(role, f.path, {k: v for k, v in asdict(sb).items()}, context,
                                 _mean_steps(samples, key), source_bytes(b.manifest.extra, role)))
    return bound_report(models, read_bandwidth(threads), threads)


def source_bytes(extra: dict, role: str) -> int | None:
    """The source GGUF's bytes per step as the export recorded them (manifest extra.quant_map[role]
    .gguf_bytes_per_token, written by the native exporter), or None."""
    v = ((extra or {}).get("quant_map") or {}).get(role, {}).get("gguf_bytes_per_token")
    return int(v) if isinstance(v, (int, float)) and v > 0 else None


def _mean_steps(samples: Sequence, key: str) -> dict[int, float]:
    count: dict[int, int] = {}
    total: dict[int, float] = {}
    for s in samples:
        for n, (c, sec) in getattr(s, key, {}).items():
            count[int(n)] = count.get(int(n), 0) + c
            total[int(n)] = total.get(int(n), 0.0) + sec
    return {n: total[n] / count[n] for n in sorted(count) if count[n]}


def format_bound(bound: dict[str, Any], max_tokens: int = 9) -> str:
    """The bound beside the measured step times, one line per model and step size."""
    bw = bound["bandwidth_bytes_per_s"]
    lines = [f"memory-bandwidth bound: streaming read {bw / 1e9:.1f} GB/s with {bound['threads']} thread(s) "
             "(bench/bound.py); a step cannot be faster than the bytes it reads / that"]
    for m in bound["models"]:
        b = m["bytes"]
        mb = {k: b.get(k, 0) / 1e6 for k in ("weights", "scales", "lm_head", "embedding_rows", "other")}
        kv = b.get("kv_per_position", 0) * m["context"] / 1e6
        bound1 = ModelBound(**m)
        lines.append(f"  {m['role']}: {mb['weights']:.0f} MB weights + {mb['scales']:.0f} MB scales + "
                     f"{mb['lm_head']:.0f} MB lm_head + {mb['other']:.0f} MB other + {kv:.1f} MB KV at "
                     f"{m['context']} positions")
        if bound1.source_bytes:
            graph = StepBytes(**b).fixed - b.get("embedding_rows", 0)
            lines.append(f"    its GGUF reads {bound1.source_bytes / 1e6:.0f} MB a step (every tensor but the token "
                         f"embedding); the graph {graph / 1e6:.0f} MB: {graph / bound1.source_bytes:.2f}x")
        for n, sec in sorted((int(k), v) for k, v in m["measured_s"].items()):
            if n > max_tokens:
                continue
            floor = bound1.step_total(n) / bw
            lines.append(f"    {n}-token step: {sec * 1e3:6.1f} ms measured, bound {floor * 1e3:5.1f} ms "
                         f"({bound1.step_total(n) / 1e6:.0f} MB): {sec / floor:.2f}x the bound")
    return "\n".join(lines)
