"""One model's export: source -> graph -> contract -> parity of the graph against the source.

The job is one skeleton whatever the source; how a source becomes a graph is its strategy (GraphSource):
- TorchGraph (here): a Hugging Face folder, hub id or GGUF loaded into a float torch model, built with
  onnxruntime-genai's builder (build.py);
- GGUFGraph (native/job.py): a GGUF read and written without torch (`--via native`).
Both end in contract.apply_contract inside their build and give the same result, so the pipeline, the
manifest and `verify` do not tell them apart except by what the manifest records.

It runs in a child process by default (see isolate.py), so everything it takes and returns is plain
data. The order keeps memory down. The torch model is used for the parity reference first, then handed
to the builder, which lets each float weight go as soon as it is quantized (reference_first). A GGUF's
reference is its own numpy forward pass, computed after the graph's session is gone, so the two never
sit in memory together. The graph is checked with onnxruntime after the source's build is done.
"""
from __future__ import annotations

import gc
import os
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator, Protocol

from edgespec.units import peak_rss_bytes

from .contract import Built
from .progress import NullProgress, Progress, trim_malloc, tune_malloc
from .sources import Source

STEPS = "prefill + 5/1/1/3-token steps"  # what parity.exported_logprobs runs the graph through


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
    # native only (the export's options, whose defaults live in native/plan.py): keep the GGUF's blocks where they
    # map (no --quant given); a block minimum exact (integer, offset) or rounded; Q6_K in 8-bit blocks of this (0: kept)
    keep_gguf_quant: bool
    gguf_minimum: str
    gguf_q6k_block: int
    head_bits: int | None = None
    ep: str = "cpu"  # graph flavor (contract.graph_flavor)
    primary: bool = True  # the role's first flavor (model.onnx) or another one (model.<flavor>.onnx)
    via: str = "torch"  # "native": a GGUF read and written without torch (native/job.py)
    gguf_body_block: int = 0  # native, the tuner's forms (native/plan.py Plan.body_block, q6k_bits)
    gguf_q6k_bits: int = 8


class GraphSource(Protocol):
    """How one kind of source becomes a graph of the contract: the job's strategy."""

    reference: str  # what the parity reference is, as the report names it
    reference_first: bool  # the reference is computed before the build (the build consumes the source)

    def load(self, progress: Progress) -> None: ...

    def reference_logprobs(self, ids: list[int], usable_vocab: int, progress: Progress):
        """float32 [len(ids), usable_vocab] log-probabilities of the source at every position."""

    def build(self, progress: Progress) -> Built: ...


class _Steps:
    """Each step's wall time and the process's peak RSS after it; freed memory handed back after each."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}
        self.peaks: dict[str, int] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t = time.perf_counter()
        yield
        gc.collect()
        trim_malloc()
        self.timings[f"{name}_s"] = time.perf_counter() - t
        self.peaks[name] = peak_rss_bytes()


def strategy(job: ModelJob) -> GraphSource:
    if job.via == "native":
        from .native.job import GGUFGraph

        return GGUFGraph(job)
    return TorchGraph(job)


def run_model_job(job: ModelJob, progress: Progress | None = None) -> dict:
    """Returns {"facts": ModelFacts as dict, "parity": report, "argmax": [T], "timings": {...},
    "peak_rss_after": {...}, "config": {...}} and "quant_map" where the strategy keeps one."""
    from . import parity

    progress = progress or NullProgress()
    source = strategy(job)
    step = _Steps()
    with step("load"):
        source.load(progress)
    ref = None
    if job.parity_ids and source.reference_first:
        with step("parity_reference"):
            ref = source.reference_logprobs(job.parity_ids, job.usable_vocab, progress)
    with step("build"):
        built = source.build(progress)
    facts = built.facts
    facts.params = int(job.source.params)
    facts.source = job.source.label

    report: dict = {}
    argmax: list[int] = []
    if job.parity_ids:
        with step("parity"):
            got, device = parity.exported_logprobs(built.onnx_path, facts, job.parity_ids, job.usable_vocab,
                                                   progress, role=job.role)
        if ref is None:
            with step("parity_reference"):
                ref = source.reference_logprobs(job.parity_ids, job.usable_vocab, progress)
        report = parity.compare(ref, got)
        report.update(text=parity.TEXT_ID, reference=source.reference, steps=STEPS, flavor=facts.flavor,
                      provider=device)
        argmax = got.argmax(axis=1).tolist()
    result = {
        "facts": asdict(facts),
        "parity": report,
        "argmax": argmax,
        "timings": {k: round(v, 2) for k, v in step.timings.items()},
        "peak_rss_after": step.peaks,
        "config": built.config,
    }
    if built.quant_map is not None:
        result["quant_map"] = built.quant_map
    return result


class TorchGraph:
    """A float torch model (sources.load_model: HF folder, hub id or GGUF dequantized) through the builder."""

    reference = "transformers float32"
    reference_first = True  # the builder takes the model and frees each float weight as it quantizes it

    def __init__(self, job: ModelJob):
        self.job = job
        self.model = None

    def load(self, progress: Progress) -> None:
        from . import sources

        if not os.environ.get("EDGESPEC_NO_MALLOC_TUNING"):
            tune_malloc()
        self.model = sources.load_model(self.job.source, progress)

    def reference_logprobs(self, ids: list[int], usable_vocab: int, progress: Progress):
        from . import parity

        with progress.stage(f"parity {self.job.role} (source)", total=1, unit="pass") as bar:
            ref = parity.reference_logprobs(self.model, ids, usable_vocab)
            bar.update(1)
        return ref

    def build(self, progress: Progress) -> Built:
        from .build import build_graph

        job = self.job
        config_dir = job.work_dir / f"{job.role}-config"
        self.model.config.save_pretrained(config_dir)
        holder = [self.model]
        self.model = None  # the builder holds the only reference from here on
        facts = build_graph(
            holder, config_dir, job.out_dir, quant=job.quant, block_size=job.block_size,
            accuracy_level=job.accuracy_level, head_bits=job.head_bits, role=job.role, progress=progress,
            ep=job.ep, primary=job.primary,
        )
        return Built(facts, job.out_dir / Path(facts.path).name, job.source.config)
