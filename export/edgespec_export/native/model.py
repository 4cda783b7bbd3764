"""One GGUF -> one graph file of the runtime's contract (before graph_edit's contract edits, which
build.py applies to the builder's graphs and job.py applies here the same way)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from onnx import TensorProto

from .gguf_model import GGUFModel, layer_names
from .graph import GraphBuilder
from .onnx_writer import OnnxWriter
from .plan import Plan


def write_graph(gg: GGUFModel, onnx_path: Path, plan: Plan, *, fp16: bool, on_tensor=None) -> GraphBuilder:
    """Writes onnx_path (+ .data), tensor by tensor. Returns the builder (its report says what each
    GGUF tensor type became)."""
    c = gg.config
    w = OnnxWriter(onnx_path)
    try:
        b = GraphBuilder(gg, w, plan, fp16=fp16, on_tensor=on_tensor)
        _write(b, w, gg)
    except BaseException:
        w.abort()
        raise
    w.finish(f"{c.arch}-native")
    return b


def _write(b: GraphBuilder, w: OnnxWriter, gg: GGUFModel) -> None:
    c = gg.config
    ft = b.ftype
    w.input("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"])
    w.input("attention_mask", TensorProto.INT64, ["batch_size", "total_sequence_length"])
    for i in range(c.layers):
        for kind in ("key", "value"):
            w.input(f"past_key_values.{i}.{kind}", ft, ["batch_size", c.kv_heads, "past_sequence_length", c.head_dim])
    w.output("logits", ft, ["batch_size", "sequence_length", c.vocab])
    for i in range(c.layers):
        for kind in ("key", "value"):
            w.output(f"present.{i}.{kind}", ft, ["batch_size", c.kv_heads, "total_sequence_length", c.head_dim])

    # seqlens_k = sum(mask) - 1 and the total length, as the builder computes them (graph_batch edits this)
    p = "/model/attn_mask_reformat/attn_mask_subgraph"
    one = w.const("/model/constant_nodes/INT64/[1]", [1])
    total = w.node("ReduceSum", ["attention_mask", one], name=f"{p}/ReduceSum", keepdims=0)[0]
    sub = w.node("Sub", [total, one], name=f"{p}/Sub")[0]
    seqlens = w.node("Cast", [sub], name=f"{p}/Sub/Cast", to=TensorProto.INT32)[0]
    shape = w.node("Shape", ["attention_mask"], name=f"{p}/Shape")[0]
    idx = w.const("/model/constant_nodes/INT64/1", 1)
    width = w.node("Gather", [shape, idx], name=f"{p}/Gather", axis=0)[0]
    total_len = w.node("Cast", [width], name=f"{p}/Gather/Cast", to=TensorProto.INT32)[0]

    inv = gg.inv_freq()
    pos = np.arange(c.context, dtype=np.float64)[:, None] * inv[None, :]
    cos = b.float_tensor("cos_cache", np.cos(pos))
    sin = b.float_tensor("sin_cache", np.sin(pos))
    del pos

    x = b.embedding("input_ids")
    residual = x
    prev = None  # (residual a, b) of the previous layer's output
    for i in range(c.layers):
        n = layer_names(i)
        lp, ip = f"/model/layers.{i}", f"model.layers.{i}"
        norm_w = b.norm_weight(n["attn_norm"], f"{ip}.input_layernorm.weight")
        if prev is None:
            h = w.node("SimplifiedLayerNormalization", [x, norm_w], [f"{lp}/input_layernorm/output_0"],
                       name=f"{lp}/input_layernorm/LayerNorm", epsilon=c.eps, axis=-1, stash_type=1)[0]
        else:
            h, _, _, residual = w.node("SkipSimplifiedLayerNormalization", [prev[0], prev[1], norm_w],
                                       [f"{lp}/input_layernorm/output_0", "", "", f"{lp}/input_layernorm/output_3"],
                                       name=f"{lp}/input_layernorm/SkipLayerNorm", domain="com.microsoft", epsilon=c.eps)
        if b.fuse:
            qkv = b.linear(h, [n["q"], n["k"], n["v"]], f"{ip}.attn.qkv_proj.MatMul", f"{lp}/attn/qkv_proj/MatMul")
        else:
            qkv = w.node("Concat", [b.linear(h, [n[t]], f"{ip}.attn.{t}_proj.MatMul", f"{lp}/attn/{t}_proj/MatMul")
                                    for t in ("q", "k", "v")], name=f"{lp}/attn/qkv_proj/Concat", axis=-1)[0]
        biases = [n[k] for k in ("q_bias", "k_bias", "v_bias")]
        if all(gg.has(t) for t in biases):
            bias = b.float_tensor(f"{ip}.attn.qkv_proj.Add.bias", np.concatenate([gg.floats(t) for t in biases]))
            for t in biases:
                gg.done(t)
            qkv = w.node("Add", [qkv, bias], name=f"{lp}/attn/qkv_proj/Add")[0]
        elif any(gg.has(t) for t in biases):
            raise ValueError(f"layer {i}: only some of the q/k/v biases are present")
        attn = w.node("GroupQueryAttention",
                      [qkv, "", "", f"past_key_values.{i}.key", f"past_key_values.{i}.value", seqlens, total_len, cos, sin],
                      [f"{lp}/attn/GroupQueryAttention/output_0", f"present.{i}.key", f"present.{i}.value"],
                      name=f"{lp}/attn/GroupQueryAttention", domain="com.microsoft", num_heads=c.heads,
                      kv_num_heads=c.kv_heads, scale=float(1.0 / np.sqrt(c.head_dim)), softcap=0.0, do_rotary=1,
                      rotary_interleaved=0)[0]
        o = b.linear(attn, [n["o"]], f"{ip}.attn.o_proj.MatMul", f"{lp}/attn/o_proj/MatMul")
        post_w = b.norm_weight(n["ffn_norm"], f"{ip}.post_attention_layernorm.weight")
        h2, _, _, residual = w.node("SkipSimplifiedLayerNormalization", [residual, o, post_w],
                                    [f"{lp}/post_attention_layernorm/output_0", "", "",
                                     f"{lp}/post_attention_layernorm/output_3"],
                                    name=f"{lp}/post_attention_layernorm/SkipLayerNorm", domain="com.microsoft",
                                    epsilon=c.eps)
        if b.fuse and len(b.groups([n["gate"], n["up"]])) == 1:  # one product, split after
            both = b.linear(h2, [n["gate"], n["up"]], f"{ip}.mlp.gate_up_proj.MatMul", f"{lp}/mlp/gate_up_proj/MatMul")
            gate, up = w.node("Split", [both, w.const(f"{lp}/mlp/gate_up_proj/SplitSizes", [c.ffn, c.ffn])], 2,
                              name=f"{lp}/mlp/gate_up_proj/Split", axis=-1)
        else:
            gate = b.linear(h2, [n["gate"]], f"{ip}.mlp.gate_proj.MatMul", f"{lp}/mlp/gate_proj/MatMul")
            up = b.linear(h2, [n["up"]], f"{ip}.mlp.up_proj.MatMul", f"{lp}/mlp/up_proj/MatMul")
        sig = w.node("Sigmoid", [gate], name=f"{lp}/mlp/act_fn/Sigmoid")[0]
        act = w.node("Mul", [gate, sig], name=f"{lp}/mlp/act_fn/Mul")[0]
        prod = w.node("Mul", [act, up], name=f"{lp}/mlp/Mul")[0]
        down = b.linear(prod, [n["down"]], f"{ip}.mlp.down_proj.MatMul", f"{lp}/mlp/down_proj/MatMul")
        prev = (residual, down)

    lp = f"/model/layers.{c.layers}"
    final_w = b.norm_weight("output_norm.weight", f"model.layers.{c.layers}.final_norm_layernorm.weight")
    final = w.node("SkipSimplifiedLayerNormalization", [prev[0], prev[1], final_w],
                   [f"{lp}/final_norm_layernorm/output_0"], name=f"{lp}/final_norm_layernorm/SkipLayerNorm",
                   domain="com.microsoft", epsilon=c.eps)[0]
    head = "token_embd.weight" if c.tied else "output.weight"
    b.linear(final, [head], "lm_head.MatMul", "/lm_head/MatMul", place="head", out="logits")
