"""Graph edit for batched steps: right-padded query chunks, marked in the attention mask.

Why: onnxruntime's GroupQueryAttention refuses a step of several rows of several tokens each over a
KV cache ("batch_size must be 1 when sequence_length > 1 and past context is given") unless it is
told, per row, how many of the step's tokens are real (its optional `query_seqlens` input). A
batched verify has rows of different lengths (each request proposes its own k), so it needs that.

How, without a new graph input: the runtime marks the padding query positions of row b with -1 in
`attention_mask` (ones for the row's cached + real new tokens, -1 for its padding tokens, 0 for the
rest of the width). The graph computes
    seqlens_k[b]     = sum(max(mask[b], 0)) - 1          (was: sum(mask[b]) - 1)
    query_seqlens[b] = S + sum(min(mask[b], 0))          (S real tokens minus the -1 marks)
and feeds query_seqlens to every GroupQueryAttention node. An all-ones mask (what every runtime
that does not batch sends) gives query_seqlens = S, which is the operator's behaviour without the
input: an edited graph answers an unbatched runtime exactly as the unedited one did, so the bundle
format and the manifest stay as they are. The graph says it was edited in its metadata
(PADDED_QUERIES_KEY), which is how the runtime knows it may batch.
"""
from __future__ import annotations

from pathlib import Path

# the model metadata key ("1" when this edit is in the graph) and query_seqlens' input index, as the runtime reads them
from edgespec.models.ortcompat import PADDED_QUERIES_KEY, QUERY_SEQLENS_INPUT


def add_padded_queries(model_path: Path, input_ids: str = "input_ids", attention_mask: str = "attention_mask") -> bool:
    """Rewrites `model_path` in place (the graph proto only; external weights are untouched).
    Returns False (and changes nothing) when the graph already has the edit."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(model_path), load_external_data=False)
    if any(p.key == PADDED_QUERIES_KEY for p in model.metadata_props):
        return False
    g = model.graph
    gqa = [n for n in g.node if n.op_type == "GroupQueryAttention"]
    if not gqa:
        raise ValueError("the graph has no GroupQueryAttention node: cannot mark padded queries")
    sums = [n for n in g.node if n.op_type == "ReduceSum" and n.input and n.input[0] == attention_mask]
    if len(sums) != 1:
        raise ValueError(f"expected one ReduceSum of {attention_mask!r} (the seqlens_k subgraph), found {len(sums)}")
    p = "/edgespec/padded_queries/"
    nodes = [
        helper.make_node("Constant", [], [p + "zero"], name=p + "Zero",
                         value=helper.make_tensor("zero", TensorProto.INT64, [], [0])),
        helper.make_node("Constant", [], [p + "axis"], name=p + "Axis",
                         value=helper.make_tensor("axis", TensorProto.INT64, [1], [1])),
        helper.make_node("Max", [attention_mask, p + "zero"], [p + "kept"], name=p + "Max"),
        helper.make_node("Min", [attention_mask, p + "zero"], [p + "marks"], name=p + "Min"),
        helper.make_node("ReduceSum", [p + "marks", p + "axis"], [p + "neg_pad"], keepdims=0, name=p + "ReduceSum"),
        helper.make_node("Shape", [input_ids], [p + "S"], start=1, end=2, name=p + "Shape"),
        helper.make_node("Add", [p + "neg_pad", p + "S"], [p + "q64"], name=p + "Add"),
        helper.make_node("Cast", [p + "q64"], [p + "query_seqlens"], to=TensorProto.INT32, name=p + "Cast"),
    ]
    for i, n in enumerate(nodes):
        g.node.insert(i, n)
    sums[0].input[0] = p + "kept"
    for n in gqa:
        while len(n.input) <= QUERY_SEQLENS_INPUT:
            n.input.append("")
        n.input[QUERY_SEQLENS_INPUT] = p + "query_seqlens"
    model.metadata_props.append(onnx.StringStringEntryProto(key=PADDED_QUERIES_KEY, value="1"))
    onnx.save(model, str(model_path))
    return True


if __name__ == "__main__":  # python -m edgespec_export.graph_batch MODEL.onnx ...: edit graphs in place
    import sys

    for arg in sys.argv[1:]:
        print(arg, "edited" if add_padded_queries(Path(arg)) else "already edited")
