"""The graph contract: what every graph of a bundle is, whichever source built it (docs/export.md).

A source becomes a graph (build.py: a torch model through onnxruntime-genai's builder; native/: a GGUF
written without torch), then `apply_contract` makes it the runtime's graph, the one pass both take:
- `graph_edit.add_logits_to_keep`: the input that limits logits to the last n positions;
- `graph_edit.add_hidden_output`: the contract-v3 output `hidden_states` draft heads read;
- `graph_edit.add_tree_inputs`: per-token positions everywhere, the attention bias (tree verify) on
  the cpu flavor only, since CUDA's GroupQueryAttention refuses one (contract v3);
- the cuda flavor: `graph_edit.logits_to_float32`; the cpu flavor: `graph_batch.add_padded_queries`, so one
  step carries several requests' rows of different lengths (server --parallel);
- `check_kernels` holds the graph to its provider's kernel contract before any bundle is written.
`facts_from_config` then reads the manifest's facts off the config and the graph's own I/O types; a
build hands the export job (job.py) a `Built`.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from edgespec.models.manifest import ModelFacts

from .graph_batch import add_padded_queries
from .graph_edit import (ATTENTION_BIAS, HIDDEN_STATES, LOGITS_TO_KEEP, POSITION_IDS, add_hidden_output,
                         add_logits_to_keep, add_tree_inputs, logits_to_float32)

QUANT_BITS = {"int4": 4, "int8": 8}


@dataclass
class Built:
    """What a strategy's build leaves: the graph (contract applied) and the facts the manifest records."""

    facts: ModelFacts  # params and source are the job's, filled in by run_model_job
    onnx_path: Path
    config: dict  # the Hugging Face config.json fields of the model
    quant_map: dict | None = None  # the form each weight got, when the strategy chose per tensor


FLAVORS = ("cpu", "cuda")


def graph_flavor(quant: str, ep: str) -> str:
    """The flavor of graph `--quant quant --ep ep` builds (docs/export.md, "Flavors").

    cpu: float32 activations and KV cache (the builder's cpu flavor), what the CPU provider runs fastest.
    cuda: float16 activations, float16 GroupQueryAttention and KV cache, 4/8-bit MatMulNBits with
    float16 scales: the only GroupQueryAttention onnxruntime's CUDA provider registers is float16/bf16,
    so a cpu-flavored graph would run its attention on the CPU, copying the KV cache every step.
    fp16 weights were always built with the builder's cuda flavor, so fp16 is "cuda" whatever --ep says."""
    if ep not in FLAVORS:
        raise ValueError(f"unknown flavor {ep!r}: one of {', '.join(FLAVORS)}")
    if quant == "fp16":
        return "cuda"
    if quant == "fp32" and ep == "cuda":
        raise ValueError("--quant fp32 has no cuda flavor (onnxruntime's CUDA GroupQueryAttention is float16 only): "
                         "use --quant int4, int8 or fp16 with --ep cuda")
    return ep


def graph_file(flavor: str, *, primary: bool = True) -> str:
    """File name of a role's graph: the first flavor `--ep` names is model.onnx (what bundles
    before flavors held, so their readers find it), another one model.<flavor>.onnx."""
    return "model.onnx" if primary else f"model.{flavor}.onnx"


def apply_contract(onnx_path: Path, flavor: str, hidden_size: int, role: str = "model") -> None:
    """Edits the graph at `onnx_path` in place into the runtime's contract for `flavor` and checks its
    kernels (the module docstring says what each edit is for). Raises ExportError on a broken kernel rule."""
    add_logits_to_keep(onnx_path)
    add_hidden_output(onnx_path, hidden_size=hidden_size)
    add_tree_inputs(onnx_path, bias=flavor != "cuda")
    if flavor == "cuda":
        logits_to_float32(onnx_path)
    else:
        # batched verify: GroupQueryAttention's query_seqlens, onnxruntime 1.32.0 and newer; the cuda flavor
        # wires none, so it loads on the onnxruntime-gpu releases that exist (kernels.ORT_FLOORS) and batched
        # serving runs on the cpu flavor
        add_padded_queries(onnx_path)
    check_kernels(onnx_path, flavor, role)


def check_kernels(onnx_path: Path, flavor: str, role: str = "model") -> None:
    """Refuses a graph that breaks its provider's kernel contract (edgespec/models/kernels.py) before
    any bundle is written: one line per rule broken, each naming the first node and the rule. Also
    one line when the installed onnxruntime is below the flavor's floor (kernels.ORT_FLOORS), which
    would otherwise fail the parity check with onnxruntime's own "invalid model"."""
    import onnxruntime

    from edgespec.errors import ExportError
    from edgespec.models.kernelcheck import check_graph, summarize
    from edgespec.models.kernels import floor_problem

    lines = summarize(check_graph(onnx_path, flavor), flavor)
    if lines:
        raise ExportError(f"the {flavor} graph of {role} breaks onnxruntime's {flavor} kernel contract, so no "
                          f"bundle was written: " + "; ".join(lines))
    problem = floor_problem(onnxruntime.__version__, flavor)
    if problem:
        raise ExportError(f"the {flavor} graph of {role} cannot be checked with this onnxruntime, so no bundle "
                          f"was written: {problem}")


def facts_from_config(cfg: dict, out_dir: Path, *, quant: str, block_size: int, accuracy_level: int,
                      name: str = "model.onnx", flavor: str = "cpu") -> ModelFacts:
    """The manifest's model facts, from the HF config and the graph's own I/O types."""
    import onnx

    text_cfg = cfg.get("text_config", cfg)
    heads = text_cfg["num_attention_heads"]
    hidden = text_cfg["hidden_size"]
    head_dim = text_cfg.get("head_dim") or hidden // heads
    model = onnx.load(str(out_dir / name), load_external_data=False)
    inputs = {i.name: i for i in model.graph.input}
    dtypes = {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.FLOAT16: "float16"}
    kv_dtype = dtypes[inputs["past_key_values.0.key"].type.tensor_type.elem_type]
    # the builder uses one io dtype for activations and the KV cache (its set_io_dtype)
    activation_dtype = kv_dtype
    logits_dtype = dtypes[{o.name: o for o in model.graph.output}["logits"].type.tensor_type.elem_type]
    quantized = quant in QUANT_BITS
    return ModelFacts(
        path=f"{out_dir.name}/{name}",
        arch=cfg.get("model_type", "unknown"),
        layers=text_cfg["num_hidden_layers"],
        kv_heads=text_cfg.get("num_key_value_heads") or heads,
        head_dim=head_dim,
        hidden_size=hidden,
        vocab_size=text_cfg["vocab_size"],
        quant=quant,
        max_context=text_cfg.get("max_position_embeddings") or 2048,
        block_size=block_size if quantized else None,
        accuracy_level=accuracy_level if quantized else None,
        kv_dtype=kv_dtype,
        logits_dtype=logits_dtype,
        logits_to_keep=LOGITS_TO_KEEP,
        flavor=flavor,
        activation_dtype=activation_dtype,
        position_ids=POSITION_IDS,
        attention_bias=ATTENTION_BIAS if ATTENTION_BIAS in inputs else None,  # cuda flavor: none (contract v3)
        hidden_states=HIDDEN_STATES,
    )
