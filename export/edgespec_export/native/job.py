"""One model's native export: GGUF -> graph (streamed) -> contract edits -> parity against the GGUF's
own numpy forward pass. Same inputs (job.ModelJob) and result as the builder path's run_model_job,
so the pipeline, the manifest and `verify` do not tell the two apart except by what the manifest records.
No torch, transformers or onnxruntime-genai: onnx, numpy, gguf and the runtime's onnxruntime.
"""
from __future__ import annotations

import gc
import time
from dataclasses import asdict
from pathlib import Path

from edgespec.units import peak_rss_bytes

from ..progress import NullProgress, Progress, trim_malloc

REFERENCE = "gguf dequantized, numpy float32"


def run_native_job(job, progress: Progress | None = None) -> dict:
    """Returns {"facts", "parity", "argmax", "timings", "peak_rss_after", "config", "quant_map"}."""
    from .. import parity
    from ..build import check_kernels, facts_from_config, graph_file, graph_flavor
    from ..graph_batch import add_padded_queries
    from ..graph_edit import add_hidden_output, add_logits_to_keep, add_tree_inputs, logits_to_float32
    from .gguf_model import GGUFModel
    from .model import write_graph
    from ..quantize import default_block_size
    from .plan import Plan, settings_for

    progress = progress or NullProgress()
    timings: dict[str, float] = {}
    peaks: dict[str, int] = {}
    gg = GGUFModel(job.source.path, f"{job.role} source")
    cfg = gg.config.hf_dict()
    flavor = graph_flavor(job.quant, job.ep)
    keep = job.keep_gguf_quant
    c = gg.config
    # the rounded tensors' block size: as asked, else quantize.py's default for this model (the builder's)
    block_size = job.block_size or default_block_size(c.hidden, c.ffn, c.heads * c.head_dim)
    plan = Plan(quant=None if keep and job.quant in ("int4", "int8") else job.quant,
                settings=settings_for(job.quant, block_size, job.accuracy_level, job.head_bits),
                minimum=job.gguf_minimum)
    job.out_dir.mkdir(parents=True, exist_ok=True)
    name = graph_file(flavor, primary=job.primary)
    onnx_path = job.out_dir / name

    t = time.perf_counter()
    n_weights = sum(1 for n in gg.tensors if n.endswith(".weight") and len(gg.tensors[n].shape) == 2)
    with progress.stage(f"build {job.role} (native)", total=n_weights + 1, unit="tensor") as bar:
        builder = write_graph(gg, onnx_path, plan, fp16=flavor == "cuda", on_tensor=lambda _n: bar.update(1))
        add_logits_to_keep(onnx_path)
        add_hidden_output(onnx_path, hidden_size=cfg["hidden_size"])
        add_tree_inputs(onnx_path, bias=flavor != "cuda")
        if flavor == "cuda":
            logits_to_float32(onnx_path)
        else:
            add_padded_queries(onnx_path)
        bar.update(1)
    check_kernels(onnx_path, flavor, job.role)
    gc.collect()
    trim_malloc()
    timings["build_s"] = time.perf_counter() - t
    peaks["build"] = peak_rss_bytes()

    quant, block_size = model_quant(builder.report, job.quant, block_size)
    facts = facts_from_config(cfg, job.out_dir, quant=quant, block_size=block_size,
                              accuracy_level=job.accuracy_level, name=name, flavor=flavor)
    facts.head_bits = builder.report.head_bits
    if quant == "mixed":  # facts_from_config knows int4/int8 only
        facts.block_size, facts.accuracy_level = block_size, job.accuracy_level
    facts.params = int(job.source.params)
    facts.source = job.source.label

    report: dict = {}
    argmax: list[int] = []
    if job.parity_ids:
        from .reference import reference_logprobs

        # the graph first: its session (the weights, prepacked) is gone before the reference's layers
        # are dequantized, so the two never sit in memory together
        t = time.perf_counter()
        got, device = parity.exported_logprobs(onnx_path, facts, job.parity_ids, job.usable_vocab, progress,
                                               role=job.role)
        gc.collect()
        trim_malloc()
        timings["parity_s"] = time.perf_counter() - t
        peaks["parity"] = peak_rss_bytes()
        t = time.perf_counter()
        with progress.stage(f"parity {job.role} (gguf, numpy)", total=gg.config.layers + 1, unit="layer") as bar:
            ref = reference_logprobs(gg, job.parity_ids, job.usable_vocab, bar)
        timings["parity_reference_s"] = time.perf_counter() - t
        peaks["parity_reference"] = peak_rss_bytes()
        report = parity.compare(ref, got)
        report.update(text=parity.TEXT_ID, reference=REFERENCE, steps="prefill + 5/1/1/3-token steps",
                      flavor=facts.flavor, provider=device)
        argmax = got.argmax(axis=1).tolist()
    return {
        "facts": asdict(facts),
        "parity": report,
        "argmax": argmax,
        "timings": {k: round(v, 2) for k, v in timings.items()},
        "peak_rss_after": peaks,
        "config": cfg,
        "quant_map": {"tensors": builder.report.forms, "weight_bytes_per_token": builder.report.bytes_read,
                      "exporter": "native"},
    }


def model_quant(report, asked: str, block_size: int) -> tuple[str, int]:
    """The manifest's quant and block_size, as the graph has them (models/derived.py checks both):
    int4 or int8 when every decoder MatMulNBits has those bits, "mixed" when a GGUF's 4- and 8-bit
    blocks sit side by side; the block size most weights use."""
    if not report.body_bits:  # float weights
        return asked, block_size
    bits = set(report.body_bits)
    quant = "int4" if bits == {4} else "int8" if bits == {8} else "mixed"
    return quant, max(report.body_blocks, key=report.body_blocks.get)
