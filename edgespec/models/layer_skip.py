"""The self-draft graph: the target's graph with some decoder layers skipped.

A skipped layer passes its residual stream through unchanged: h_{i+1} = h_i. In the builder's graphs
the residual stream between layers is never a tensor of its own: it is the pair (a, b) that the next
layer's input norm (a SkipSimplifiedLayerNormalization, or the final norm for the last layer) adds
before normalizing, its outputs being [normed, -, -, a + b]. So skipping layer i is one rewire: the
node that consumes layer i's output pair is given layer i's *input* pair instead (what layer i's own
input norm reads). Layer i's nodes are then dead; they are removed with its past/present KV inputs
and outputs. Everything else, kept layers' KV names included, is untouched, so the runtime binds the
target's own KV buffers for the kept layers (docs/runtime.md, "Self-speculative drafting").

Layer 0 cannot be skipped: its input norm reads the embedding alone (no pair to pass on), and it is
the layer a self-draft can least afford to lose anyway.

Works on the graph proto only: nothing is loaded, the initializers stay references into the
target's external data file (the draft session is given the target's own weight OrtValues:
core/slot.py SkipGraph). Needs the `onnx` package (the export extra, or `pip install onnx`).
"""
from __future__ import annotations

from typing import Iterable, Sequence

_SKIP_NORM_OPS = ("SkipSimplifiedLayerNormalization", "SkipLayerNormalization")


class LayerSkipError(ValueError):
    """The graph does not have the layer structure this edit understands, or the skip set is bad."""


def _layer_prefix(i: int) -> str:
    return f"/model/layers.{i}/"


def _input_norm(nodes, i: int):
    """Layer i's input norm: the first Skip*LayerNormalization of layer i (for the layer after the
    last one, the final norm, which the builder names /model/layers.{L}/final_norm_layernorm)."""
    prefix = _layer_prefix(i)
    for n in nodes:
        if n.name.startswith(prefix) and n.op_type in _SKIP_NORM_OPS:
            return n
    return None


def check_skip(skip: Iterable[int], layers: int) -> list[int]:
    """The skip set, sorted and checked: layers 1 .. layers-1, at least one layer kept besides 0."""
    out = sorted(set(int(i) for i in skip))
    bad = [i for i in out if not 1 <= i < layers]
    if bad:
        raise LayerSkipError(f"cannot skip layer(s) {bad}: a {layers}-layer model can skip layers 1..{layers - 1}"
                             " (layer 0 reads the embedding and is always kept)")
    return out


def skip_layers(model, skip: Sequence[int], layers: int):
    """Returns a copy of the ONNX ModelProto `model` with the decoder layers in `skip` removed.

    The copy shares nothing mutable with `model`; its initializers are the same external-data
    references (nothing is loaded). Raises LayerSkipError when the graph is not of the expected
    shape (then no self-draft is possible from it)."""
    from onnx import ModelProto

    skip = check_skip(skip, layers)
    out = ModelProto()
    out.CopyFrom(model)
    g = out.graph
    nodes = list(g.node)
    for i in skip:  # ascending: a run of skipped layers chains through the rewired inputs
        here = _input_norm(nodes, i)
        after = _input_norm(nodes, i + 1)
        if here is None or after is None:
            raise LayerSkipError(f"layer {i}: no residual-add norm found at /model/layers.{i}/ and "
                                 f"/model/layers.{i + 1}/ (not a graph of onnxruntime-genai's builder?)")
        after.input[0] = here.input[0]
        after.input[1] = here.input[1]
    dropped = {f"past_key_values.{i}.{kv}" for i in skip for kv in ("key", "value")}
    dropped |= {f"present.{i}.{kv}" for i in skip for kv in ("key", "value")}
    keep_in = [v for v in g.input if v.name not in dropped]
    keep_out = [v for v in g.output if v.name not in dropped]
    del g.input[:]
    g.input.extend(keep_in)
    del g.output[:]
    g.output.extend(keep_out)
    _prune(g)
    return out


def _prune(g) -> None:
    """Removes nodes whose outputs reach no graph output, and initializers no node reads."""
    producer = {}
    for n in g.node:
        for o in n.output:
            if o:
                producer[o] = n
    live: set[int] = set()
    stack = [o.name for o in g.output]
    seen: set[str] = set()
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        n = producer.get(name)
        if n is None or id(n) in live:
            continue
        live.add(id(n))
        stack.extend(x for x in n.input if x)
        for attr in n.attribute:  # subgraphs (If/Loop) read outer names too
            if attr.g is not None:
                for sn in attr.g.node:
                    stack.extend(x for x in sn.input if x)
    kept = [n for n in g.node if id(n) in live]
    del g.node[:]
    g.node.extend(kept)
    used = {x for n in g.node for x in n.input}
    inits = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(inits)
