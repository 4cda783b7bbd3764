"""Hugging Face folder -> ONNX graph of the runtime's contract, with onnxruntime-genai's builder.

The builder emits GroupQueryAttention with a shared past/present buffer (written in place when the
runtime binds both to one OrtValue) and quantizes MatMuls (and, on request, the embedding Gather
and lm_head) to MatMulNBits/GatherBlockQuantized. We then add the logits-to-keep input.
"""
from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

from edgespec.manifest import ModelFacts

from .graph_edit import LOGITS_TO_KEEP, add_logits_to_keep

BUILDER_PRECISION = {"int4": "int4", "int8": "int8", "fp16": "fp16", "fp32": "fp32"}


def builder_options(quant: str, block_size: int, accuracy_level: int, *, tied: bool) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    if quant in ("int4", "int8"):
        opts["int4_block_size"] = block_size
        opts["int4_accuracy_level"] = accuracy_level
        # quantize the embedding Gather too (and the lm_head MatMul): 1.92 GB -> 1.13 GB for the 1.5B
        opts["op_types_to_quantize"] = "MatMul/Gather"
        if tied:
            opts["shared_embeddings"] = "true"
    return opts


def build_graph(
    hf_dir: Path,
    out_dir: Path,
    *,
    quant: str = "int4",
    block_size: int = 32,
    accuracy_level: int = 4,
    cache_dir: Path | None = None,
    quiet: bool = True,
) -> ModelFacts:
    """Writes out_dir/model.onnx (+ model.onnx.data) and returns the facts for the manifest
    (with `path` relative to out_dir's parent, i.e. the bundle root)."""
    from onnxruntime_genai.models import builder

    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((hf_dir / "config.json").read_text())
    tied = bool(cfg.get("tie_word_embeddings", False))
    raw = {k: str(v) for k, v in builder_options(quant, block_size, accuracy_level, tied=tied).items()}
    cache = cache_dir or (out_dir / ".builder-cache")
    sink = io.StringIO()
    redirect = contextlib.redirect_stdout(sink) if quiet else contextlib.nullcontext()
    with redirect:
        extra = builder.parse_extra_options(
            "", str(hf_dir), str(out_dir), BUILDER_PRECISION[quant], "cpu", str(cache),
            [f"{k}={v}" for k, v in raw.items()],
        )
        _create_model_without_processing(builder, str(hf_dir), out_dir, BUILDER_PRECISION[quant], str(cache), extra)
    for leftover in ("genai_config.json",):
        (out_dir / leftover).unlink(missing_ok=True)
    if cache_dir is None:
        import shutil

        shutil.rmtree(cache, ignore_errors=True)
    add_logits_to_keep(out_dir / "model.onnx")
    return facts_from_config(cfg, out_dir, quant=quant, block_size=block_size, accuracy_level=accuracy_level)


def _create_model_without_processing(builder, hf_dir: str, out_dir: Path, precision: str, cache: str, extra: dict) -> None:
    """The builder ends by copying tokenizer files with transformers' AutoTokenizer, which fails on
    folders with only a tokenizer.json and can pull the hub; the bundle writer handles tokenizers
    itself, so that step is skipped."""
    base = builder.Model if hasattr(builder, "Model") else None
    saved = getattr(base, "save_processing", None) if base is not None else None
    if base is not None:
        base.save_processing = lambda *a, **k: None
    try:
        builder.create_model("", hf_dir, str(out_dir), precision, "cpu", cache, **extra)
    finally:
        if base is not None and saved is not None:
            base.save_processing = saved


def facts_from_config(cfg: dict, out_dir: Path, *, quant: str, block_size: int, accuracy_level: int) -> ModelFacts:
    import onnx

    text_cfg = cfg.get("text_config", cfg)
    heads = text_cfg["num_attention_heads"]
    hidden = text_cfg["hidden_size"]
    head_dim = text_cfg.get("head_dim") or hidden // heads
    model = onnx.load(str(out_dir / "model.onnx"), load_external_data=False)
    inputs = {i.name: i for i in model.graph.input}
    elem = inputs["past_key_values.0.key"].type.tensor_type.elem_type
    kv_dtype = {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.FLOAT16: "float16"}[elem]
    out_elem = {o.name: o for o in model.graph.output}["logits"].type.tensor_type.elem_type
    logits_dtype = {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.FLOAT16: "float16"}[out_elem]
    arch = cfg.get("model_type", "unknown")
    return ModelFacts(
        path=f"{out_dir.name}/model.onnx",
        arch=arch,
        layers=text_cfg["num_hidden_layers"],
        kv_heads=text_cfg.get("num_key_value_heads", heads),
        head_dim=head_dim,
        hidden_size=hidden,
        vocab_size=text_cfg["vocab_size"],
        quant=quant,
        max_context=text_cfg.get("max_position_embeddings", 2048),
        block_size=block_size if quant in ("int4", "int8") else None,
        accuracy_level=accuracy_level if quant in ("int4", "int8") else None,
        kv_dtype=kv_dtype,
        logits_dtype=logits_dtype,
        logits_to_keep=LOGITS_TO_KEEP,
    )
