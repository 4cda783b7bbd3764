"""Edits to the builder's graph that the runtime relies on.

`add_logits_to_keep`: the builder's graph returns logits for every input position, so a 1000-token
prefill of a 152k-vocabulary model would return ~600 MB. We slice the hidden states to the last n
positions *before* the lm_head MatMul, with n an int64 [1] input: 1 for a prefill, k+1 for a verify.
That also saves the lm_head compute for the other positions.
"""
from __future__ import annotations

from pathlib import Path

LOGITS_TO_KEEP = "num_logits_to_keep"


def add_logits_to_keep(model_path: Path, logits_name: str = "logits") -> None:
    """Rewrites `model_path` in place (the graph proto only; external weights are untouched)."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(model_path), load_external_data=False)
    g = model.graph
    if any(i.name == LOGITS_TO_KEEP for i in g.input):
        return
    producers = [n for n in g.node if logits_name in n.output]
    if len(producers) != 1:
        raise ValueError(f"expected one node producing {logits_name!r}, found {len(producers)}")
    lm_head = producers[0]
    if lm_head.op_type not in ("MatMul", "MatMulNBits", "Gemm"):
        raise ValueError(f"the node producing {logits_name!r} is a {lm_head.op_type}, expected the lm_head MatMul")
    hidden = lm_head.input[0]
    g.input.append(helper.make_tensor_value_info(LOGITS_TO_KEEP, TensorProto.INT64, [1]))
    new_nodes = [
        helper.make_node("Neg", [LOGITS_TO_KEEP], ["/edgespec/logits_start"], name="/edgespec/Neg"),
        helper.make_node(
            "Constant", [], ["/edgespec/logits_end"], name="/edgespec/End",
            value=helper.make_tensor("end", TensorProto.INT64, [1], [2**62]),
        ),
        helper.make_node(
            "Constant", [], ["/edgespec/seq_axis"], name="/edgespec/Axis",
            value=helper.make_tensor("axis", TensorProto.INT64, [1], [1]),
        ),
        helper.make_node(
            "Slice", [hidden, "/edgespec/logits_start", "/edgespec/logits_end", "/edgespec/seq_axis"],
            ["/edgespec/last_hidden"], name="/edgespec/SliceLast",
        ),
    ]
    at = list(g.node).index(lm_head)
    for offset, node in enumerate(new_nodes):
        g.node.insert(at + offset, node)
    lm_head.input[0] = "/edgespec/last_hidden"
    for out in g.output:
        if out.name == logits_name and len(out.type.tensor_type.shape.dim) >= 2:
            out.type.tensor_type.shape.dim[1].ClearField("dim_value")
            out.type.tensor_type.shape.dim[1].dim_param = "num_logits_to_keep"
    onnx.save(model, str(model_path))


def logits_to_float32(model_path: Path, logits_name: str = "logits") -> None:
    """Makes a float16 graph return float32 logits (a Cast after the lm_head), in place.

    Why: the cuda flavor computes in float16, and its logits would be float16 too (the builder's
    io dtype). The values stay float16-rounded either way; float32 keeps the runtime's sampling and
    verification code on one dtype, and costs 2 extra bytes per vocabulary entry per kept row only
    (logits_to_keep rows, not the whole sequence). A graph already returning float32 is unchanged."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(model_path), load_external_data=False)
    g = model.graph
    out = next((o for o in g.output if o.name == logits_name), None)
    if out is None:
        raise ValueError(f"the graph has no output {logits_name!r}")
    if out.type.tensor_type.elem_type == TensorProto.FLOAT:
        return
    producer = next(n for n in g.node if logits_name in n.output)
    half = "/edgespec/logits_fp16"
    producer.output[list(producer.output).index(logits_name)] = half
    cast = helper.make_node("Cast", [half], [logits_name], name="/edgespec/LogitsToFloat32", to=TensorProto.FLOAT)
    g.node.insert(list(g.node).index(producer) + 1, cast)
    out.type.tensor_type.elem_type = TensorProto.FLOAT
    onnx.save(model, str(model_path))


# --- graph contract v2: per-token positions and an additive attention bias -----------------------
POSITION_IDS = "position_ids"
ATTENTION_BIAS = "attention_bias"
# GroupQueryAttention's optional input slots (onnxruntime 1.32 contrib op):
# 0 query 1 key 2 value 3 past_key 4 past_value 5 seqlens_k 6 total_sequence_length 7 cos_cache
# 8 sin_cache 9 position_ids 10 attention_bias 11 head_sink
_GQA_POSITION_SLOT = 9
_GQA_BIAS_SLOT = 10


def add_tree_inputs(model_path: Path, *, bias: bool = True) -> None:
    """Adds the contract inputs and wires them into every GroupQueryAttention node, in place:

    - `position_ids` int64 [batch, seq]: the rotary position of each input token (a chain step
      feeds L..L+S-1, a tree feeds L + depth of each node);
    - `attention_bias` [batch or 1, heads or 1, seq, total] of the attention's float type, added to
      the attention scores on top of GQA's own causal mask (0 = may attend, a large negative
      number = may not): a tree's ancestor mask. A chain step feeds zeros.

    `bias=False` (the cuda flavor, graph contract v3): `position_ids` only. onnxruntime's CUDA
    GroupQueryAttention refuses any attention_bias on every run (edgespec/models/kernels.py), and a
    chain needs none: GQA's own causal mask is the chain's mask. Trees stay on the cpu flavor.

    Why a graph edit and not a builder option: the builder leaves both slots empty, and GQA's CPU
    kernel derives positions from the cache length when they are absent, which is right for a chain
    and wrong for a tree (siblings share a position)."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(model_path), load_external_data=False)
    g = model.graph
    names = {i.name for i in g.input}
    if POSITION_IDS in names and (ATTENTION_BIAS in names or not bias):
        return
    gqa = [n for n in g.node if n.op_type == "GroupQueryAttention"]
    if not gqa:
        raise ValueError("no GroupQueryAttention node: not a graph of the runtime's contract")
    past = next((i for i in g.input if i.name.startswith("past_key_values.")), None)
    if past is None:
        raise ValueError("no past_key_values input: not a graph of the runtime's contract")
    float_type = past.type.tensor_type.elem_type  # the attention's T (the cache has the query's type)
    slots = {_GQA_POSITION_SLOT: POSITION_IDS, **({_GQA_BIAS_SLOT: ATTENTION_BIAS} if bias else {})}
    for n in gqa:
        while len(n.input) <= max(slots):
            n.input.append("")
        if any(n.input[slot] for slot in slots):
            raise ValueError(f"{n.name}: position_ids/attention_bias already wired to something else")
        for slot, name in slots.items():
            n.input[slot] = name
    g.input.append(helper.make_tensor_value_info(POSITION_IDS, TensorProto.INT64, ["batch_size", "sequence_length"]))
    if bias:
        g.input.append(helper.make_tensor_value_info(
            ATTENTION_BIAS, float_type, ["bias_batch", "bias_heads", "sequence_length", "total_sequence_length"]))
    onnx.save(model, str(model_path))


# --- graph contract v3: the final normed hidden state of the kept rows ----------------------------
HIDDEN_STATES = "hidden_states"


def add_hidden_output(model_path: Path, logits_name: str = "logits", *, hidden_size: int | str = "hidden_size") -> None:
    """Adds the output `hidden_states` [batch, n, hidden] float32, in place: the final normed hidden
    state of the rows the logits are computed for (the lm_head's input after `add_logits_to_keep`'s
    slice, so n = num_logits_to_keep). Draft heads trained at export (`--heads`) read it.

    Why the lm_head's input: it is the hidden state after the final norm, already computed for the
    logits, so the output costs no extra pass (a float16 graph adds one Cast of n x hidden values).
    `hidden_size` is written into the output's shape, so the loader can check the manifest's
    hidden_size against the graph (the runner preallocates the output from the manifest).
    Run after add_logits_to_keep; a graph that already has the output is unchanged."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(model_path), load_external_data=False)
    g = model.graph
    if any(o.name == HIDDEN_STATES for o in g.output):
        return
    producers = [n for n in g.node if logits_name in n.output or "/edgespec/logits_fp16" in n.output]
    head = next((n for n in producers if n.op_type in ("MatMul", "MatMulNBits", "Gemm")), None)
    if head is None:
        raise ValueError(f"no lm_head MatMul produces {logits_name!r}: cannot expose its hidden state")
    hidden = head.input[0]
    logits = next(o for o in g.output if o.name == logits_name)
    dims = [d.dim_param or d.dim_value for d in logits.type.tensor_type.shape.dim][:2] or ["batch_size", "n"]
    elem = next((v.type.tensor_type.elem_type for v in g.value_info if v.name == hidden), None)
    if elem is None:  # the builder's graphs type the hidden state as their io dtype (the cache's)
        past = next(i for i in g.input if i.name.startswith("past_key_values."))
        elem = past.type.tensor_type.elem_type
    if elem == TensorProto.FLOAT:
        g.node.append(helper.make_node("Identity", [hidden], [HIDDEN_STATES], name="/edgespec/HiddenOut"))
    else:
        g.node.append(helper.make_node("Cast", [hidden], [HIDDEN_STATES], name="/edgespec/HiddenToFloat32",
                                       to=TensorProto.FLOAT))
    g.output.append(helper.make_tensor_value_info(HIDDEN_STATES, TensorProto.FLOAT, [*dims, hidden_size]))
    onnx.save(model, str(model_path))
