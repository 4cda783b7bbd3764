"""One model's export: load -> parity reference -> build + quantize + save -> parity of the graph.

It runs in a child process by default (see isolate.py), so everything it takes and returns is plain
data. The order keeps memory down: the float model is used for the parity reference first, then
handed to the builder, which lets each float weight go as soon as it is quantized; the graph is then
checked with onnxruntime after the torch model is gone.
"""
from __future__ import annotations

import gc
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from edgespec.units import peak_rss_bytes

from .progress import NullProgress, Progress, trim_malloc, tune_malloc
from .sources import Source


@dataclass
class ModelJob:
    role: str  # "target" | "draft"
    source: Source
    out_dir: Path  # <bundle>.partial/<role>
    work_dir: Path  # scratch (config for the builder)
    quant: str
    block_size: int | None  # None: quantize.default_block_size for the model's widths
    accuracy_level: int
    parity_ids: list[int]
    usable_vocab: int
    head_bits: int | None = None
    ep: str = "cpu"  # graph flavor (build.graph_flavor)
    primary: bool = True  # the role's first flavor (model.onnx) or another one (model.<flavor>.onnx)
    via: str = "torch"  # "native": a GGUF read and written without torch (native/job.py)
    keep_gguf_quant: bool = True  # native: keep the GGUF's blocks where they map (no --quant given)
    gguf_minimum: str = "offset"  # native: a block minimum exact ("offset") or as integer zero points


def run_model_job(job: ModelJob, progress: Progress | None = None) -> dict:
    """Returns {"facts": ModelFacts as dict, "parity": report, "argmax": [T], "timings": {...}, "config": {...}}."""
    if job.via == "native":
        from .native.job import run_native_job

        return run_native_job(job, progress)
    from . import parity, sources
    from .build import build_graph

    import os

    progress = progress or NullProgress()
    if not os.environ.get("EDGESPEC_NO_MALLOC_TUNING"):
        tune_malloc()
    timings: dict[str, float] = {}
    t = time.perf_counter()
    model = sources.load_model(job.source, progress)
    timings["load_s"] = time.perf_counter() - t
    peaks = {"load": peak_rss_bytes()}  # the process's peak RSS so far, after each step
    config_dir = job.work_dir / f"{job.role}-config"
    model.config.save_pretrained(config_dir)

    t = time.perf_counter()
    ref = None
    if job.parity_ids:
        with progress.stage(f"parity {job.role} (source)", total=1, unit="pass") as bar:
            ref = parity.reference_logprobs(model, job.parity_ids, job.usable_vocab)
            bar.update(1)
    timings["parity_reference_s"] = time.perf_counter() - t
    peaks["parity_reference"] = peak_rss_bytes()

    t = time.perf_counter()
    holder = [model]
    del model
    facts = build_graph(
        holder, config_dir, job.out_dir, quant=job.quant, block_size=job.block_size,
        accuracy_level=job.accuracy_level, head_bits=job.head_bits, role=job.role, progress=progress,
        ep=job.ep, primary=job.primary,
    )
    gc.collect()
    trim_malloc()
    timings["build_s"] = time.perf_counter() - t
    peaks["build"] = peak_rss_bytes()
    facts.params = int(job.source.params)
    facts.source = job.source.label

    report: dict = {}
    argmax: list[int] = []
    if ref is not None:
        t = time.perf_counter()
        got, device = parity.exported_logprobs(job.out_dir / Path(facts.path).name, facts, job.parity_ids,
                                               job.usable_vocab, progress, role=job.role)
        report = parity.compare(ref, got)
        report.update(text=parity.TEXT_ID, reference="transformers float32", steps="prefill + 5/1/1/3-token steps",
                      flavor=facts.flavor, provider=device)
        argmax = got.argmax(axis=1).tolist()
        timings["parity_s"] = time.perf_counter() - t
        peaks["parity"] = peak_rss_bytes()
    return {
        "facts": asdict(facts),
        "parity": report,
        "argmax": argmax,
        "timings": {k: round(v, 2) for k, v in timings.items()},
        "peak_rss_after": peaks,
        "config": job.source.config,
    }
