"""Torch model -> ONNX graph of the runtime's contract, with onnxruntime-genai's model builder.

The builder emits GroupQueryAttention with a shared past/present buffer (written in place when the
runtime binds both to one OrtValue). We drive it with three changes that keep the export lean:
- it gets the model we already loaded (its own loader would read the checkpoint a second time);
- its whole-graph quantization pass is replaced by `quantize.quantize_graph`, one weight at a time
  (same onnxruntime kernels, byte-identical output, the float weights never held twice);
- its genai_config/tokenizer side outputs are skipped (the bundle writer owns those).
Then `contract.apply_contract` makes it the runtime's graph (the same pass a GGUF's native graph takes).
"""
from __future__ import annotations

import io
import json
import re
import shutil
from contextlib import contextmanager, redirect_stdout
from pathlib import Path
from typing import Any

from edgespec.models.manifest import ModelFacts

from .contract import QUANT_BITS, apply_contract, facts_from_config, graph_file, graph_flavor
from .progress import NullProgress, Progress, trim_malloc
from .quantize import (DEFAULT_ACCURACY_LEVEL, DEFAULT_HEAD_BITS, QuantSettings, default_block_size,
                       quantizable_nodes, quantize_graph)


def builder_options(quant: str, block_size: int, accuracy_level: int, *, tied: bool,
                    flavor: str | None = None) -> dict[str, str]:
    """The builder's --extra_options for one of our quant modes (flavor: default graph_flavor(quant, "cpu"))."""
    opts: dict[str, str] = {}
    if (flavor or graph_flavor(quant, "cpu")) == "cuda":
        # the fused Q/K-norm GroupQueryAttention (qwen3) is CUDA-only: without it the cuda flavor
        # also runs on the CPU provider (parity, tests, a fallback). What the unfused form costs on
        # CUDA is not measured (no GPU here): scripts/gpu-check.sh is where to find out.
        opts["fuse_qk_norm_gqa"] = "false"
    if quant == "int4":
        # embeddings (Gather) and lm_head quantized too: 1.92 GB -> 1.13 GB for the 1.5B
        opts.update(block_size=str(block_size), accuracy_level=str(accuracy_level), op_types_to_quantize="MatMul/Gather")
    elif quant == "int8":
        # the embedding too, at 8 bits (quantize.py: a tied one reads the lm_head's 8-bit tensor)
        opts.update(block_size=str(block_size), accuracy_level=str(accuracy_level), op_types_to_quantize="MatMul/Gather")
    return opts


class _LayerCounter(io.TextIOBase):
    """Stands in for stdout while the builder runs: its "Reading layer N" lines drive a progress bar,
    everything else is kept (for a failure report) but not shown."""

    PATTERN = re.compile(r"^Reading (embedding layer|layer \d+|final norm|LM head)", re.M)

    def __init__(self, stage):
        self.stage = stage
        self.log = io.StringIO()

    def write(self, s: str) -> int:
        self.log.write(s)
        n = len(self.PATTERN.findall(s))
        if n:
            self.stage.update(n)
        return len(s)


@contextmanager
def _builder_hooks(builder, model_holder: list, captured: dict):
    base = builder.Model
    names = ("load_weights", "save_model", "make_genai_config", "save_processing")
    saved = {n: base.__dict__[n] for n in names}

    def load_weights(self, input_path):
        return model_holder.pop()  # the builder keeps the only reference from here on

    def save_model(self, out_dir):
        captured["model"] = self

    base.load_weights = load_weights
    base.save_model = save_model
    base.make_genai_config = lambda self, *a, **k: None
    base.save_processing = lambda self, *a, **k: None
    try:
        yield
    finally:
        for n, f in saved.items():
            setattr(base, n, f)


def build_graph(
    model_holder: list,
    config_dir: Path,
    out_dir: Path,
    *,
    quant: str = "int4",
    block_size: int | None = None,
    accuracy_level: int = DEFAULT_ACCURACY_LEVEL,
    head_bits: int | None = None,
    embed_bits: int | None = None,
    role: str = "model",
    progress: Progress | None = None,
    ep: str = "cpu",
    primary: bool = True,
) -> ModelFacts:
    """Writes out_dir/model.onnx (+ model.onnx.data) from the torch model in `model_holder` (a
    one-element list, emptied here so the float weights can be freed as they are quantized) and the
    config.json in `config_dir`. Returns the facts for the manifest (path relative to the bundle).
    `block_size`: None is quantize.default_block_size for this model's widths.
    `head_bits`: the lm_head's (and a tied embedding's) bits, default DEFAULT_HEAD_BITS; `embed_bits`:
    an untied embedding's, default the body's. `ep`: the flavor to build (graph_flavor); the cuda
    flavor gets its logits cast to float32 (graph_edit). `primary=False`: written as
    model.<flavor>.onnx next to the role's first flavor (graph_file)."""
    import onnx_ir as ir
    from onnxruntime_genai.models import builder

    progress = progress or NullProgress()
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((config_dir / "config.json").read_text())
    text_cfg = cfg.get("text_config", cfg)
    tied = bool(cfg.get("tie_word_embeddings", False))
    if block_size is None:
        hidden, heads = text_cfg["hidden_size"], text_cfg["num_attention_heads"]
        attn = heads * (text_cfg.get("head_dim") or hidden // heads)
        block_size = default_block_size(hidden, text_cfg["intermediate_size"], attn, role=role)
    precision = quant
    flavor = graph_flavor(quant, ep)
    ep = flavor  # the builder's execution provider names are our flavor names
    raw = builder_options(quant, block_size, accuracy_level, tied=tied, flavor=flavor)
    cache = out_dir.parent / f".builder-cache-{out_dir.name}"
    captured: dict[str, Any] = {}
    with progress.stage(f"build {role}", total=text_cfg["num_hidden_layers"] + 3, unit="layer") as bar:
        counter = _LayerCounter(bar)
        with _builder_hooks(builder, model_holder, captured), redirect_stdout(counter):
            extra = builder.parse_extra_options(
                "", str(config_dir), str(out_dir), precision, ep, str(cache), [f"{k}={v}" for k, v in raw.items()]
            )
            builder.create_model("", str(config_dir), str(out_dir), precision, ep, str(cache), **extra)
    shutil.rmtree(cache, ignore_errors=True)
    onnx_builder = captured.pop("model")
    model = onnx_builder.model
    if quant in QUANT_BITS:
        qa = onnx_builder.quant_attrs
        head_bits = head_bits or DEFAULT_HEAD_BITS[quant]
        embed_bits = embed_bits or QUANT_BITS[quant]
        settings = QuantSettings(
            bits=qa["bits"], block_size=int(qa["qdq_block_size"]), accuracy_level=int(qa["accuracy_level"]),
            symmetric=bool(qa["is_symmetric"]), op_types=tuple(qa["op_types_to_quantize"]),
            exclude=tuple(qa["nodes_to_exclude"]), head_bits=head_bits, embed_bits=embed_bits,
        )
        total = len(quantizable_nodes(model.graph, settings))
        with progress.stage(f"quantize {role} ({quant})", total=total, unit="weight") as bar:
            def done(_name: str) -> None:
                bar.update(1)
                trim_malloc()  # hand the freed float weight back now (see progress.tune_malloc)

            quantize_graph(model, settings, on_tensor=done)
    model.graph.sort()
    name = graph_file(flavor, primary=primary)
    onnx_path = out_dir / name
    n_tensors = len(model.graph.initializers)
    with progress.stage(f"save {role}", total=n_tensors, unit="tensor") as bar:
        ir.save(model, str(onnx_path), external_data=name + ".data", size_threshold_bytes=0,
                callback=lambda _tensor, _meta: bar.update(1))
    del model, onnx_builder
    apply_contract(onnx_path, flavor, text_cfg["hidden_size"], role)
    facts = facts_from_config(cfg, out_dir, quant=quant, block_size=block_size, accuracy_level=accuracy_level,
                              name=name, flavor=flavor)
    if quant in QUANT_BITS:
        facts.head_bits = head_bits
    return facts
