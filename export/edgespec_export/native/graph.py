"""The decoder graph of the runtime's contract, written node by node from a GGUF file.

The same nodes, names and inputs as onnxruntime-genai's builder writes for these architectures (so
`graph_edit` / `graph_batch` apply unchanged, and the layer-skip edit of the self-draft finds its
layers): a GatherBlockQuantized (or Gather) embedding, per layer a (Skip)SimplifiedLayerNormalization,
a fused q/k/v MatMulNBits into GroupQueryAttention with the in-place cache and rotary caches, the
output projection, a SiLU-gated MLP, the final norm and the lm_head. Two differences, both exact:
- blocks with a minimum (Q4_K, Q4_1, ...) add an offset term: y += blocksum32(x) @ offset^T, the
  per-32-block sums of the input (Reshape + ReduceSum) times a small float matrix (blocks.py);
- q, k and v of different GGUF types (Q4_K_M keeps some v at Q6_K) are three MatMulNBits and a Concat.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from onnx import TensorProto

from .blocks import (MIN_HI, OFFSET_BLOCK, Encoded, decode, offset_to_integer, offset_to_zero_points, pack,
                     pack_minimums, pack_zero_points, round_min_max, round_to_nearest)
from .gguf_model import GGUFModel, layer_names
from .onnx_writer import OnnxWriter
from .plan import Form, Plan

CHUNK_VALUES = 1 << 24  # weights decoded at a time for the vocabulary-sized tensors (~16 M: ~100 MB of temporaries)


@dataclass
class Report:
    """What happened to each tensor type: {"Q4_K -> Q4_K kept (4-bit blocks)": count}, the bits read."""

    forms: dict[str, int] = field(default_factory=dict)
    body_bits: dict[int, int] = field(default_factory=dict)  # bits -> weights (decoder MatMuls)
    body_blocks: dict[int, int] = field(default_factory=dict)  # block size -> weights (decoder MatMuls)
    head_bits: int | None = None  # the lm_head's MatMulNBits bits (None: a float lm_head)
    bytes_read: int = 0  # bytes of weights a one-token step reads (all MatMuls, one embedding row)

    minimum: str = "offset"

    def add(self, type_name: str, form: Form, weights: int) -> None:
        key = form.label(type_name, self.minimum)
        self.forms[key] = self.forms.get(key, 0) + 1


class GraphBuilder:
    def __init__(self, gg: GGUFModel, writer: OnnxWriter, plan: Plan, *, fp16: bool, on_tensor=None):
        self.gg, self.w, self.plan, self.fp16 = gg, writer, plan, fp16
        self.c = gg.config
        self.ftype = TensorProto.FLOAT16 if fp16 else TensorProto.FLOAT
        self.np_float = np.float16 if fp16 else np.float32
        self.report = Report(minimum=plan.minimum)
        self.on_tensor = on_tensor or (lambda name: None)
        self.blocksums: dict[str, str] = {}
        # q/k/v and gate/up stored alike as one MatMulNBits each (split after); False: one product per
        # weight (for measuring the two side by side)
        self.fuse = plan.fuse

    # --- weights --------------------------------------------------------------------------------
    def _encoded(self, name: str, form: Form, lo: int, hi: int, place: str = "body") -> Encoded | np.ndarray:
        """Rows lo..hi of a GGUF tensor in `form`: an Encoded, or float32 rows [n, K]. A block minimum
        takes the plan's form in a product (place "body"); an embedding's stays an offset (a Gather)."""
        if form.kind == "exact":
            e = decode(self.gg.raw_rows(name, lo, hi), self.gg.type_name(name))
            if self.plan.minimum == "zero-point":
                return offset_to_zero_points(e)
            return offset_to_integer(e) if self.plan.minimum == "integer" and place == "body" else e
        w = self.gg.floats(name, lo, hi)
        if form.kind == "float":
            return w
        rounding = round_min_max if form.zero_points else round_to_nearest
        return rounding(w, form.bits, form.block or self.plan.settings.block_size)

    def _rows(self, name: str) -> list[tuple[int, int]]:
        n, k = self.gg.shape(name)
        step = max(1, CHUNK_VALUES // k)
        return [(lo, min(n, lo + step)) for lo in range(0, n, step)]

    def float_tensor(self, name: str, array: np.ndarray) -> str:
        """A float initializer in the graph's float type (float32, or float16 for cuda): its name."""
        return self.w.tensor(name, np.asarray(array, dtype=self.np_float))

    def norm_weight(self, gguf_name: str, onnx_name: str) -> str:
        """A norm's weight from the GGUF, as a float initializer (the GGUF tensor is then released)."""
        out = self.float_tensor(onnx_name, self.gg.floats(gguf_name))
        self.gg.done(gguf_name)
        return out

    # --- linear layers --------------------------------------------------------------------------
    def _blocksum(self, x: str, k: int, prefix: str) -> str:
        """Per-32-block sums of x [B, S, K] -> [B, S, K/32] (computed once per input)."""
        if x not in self.blocksums:
            shape = self.w.const(f"{prefix}/BlockShape", [0, 0, k // OFFSET_BLOCK, OFFSET_BLOCK])
            r = self.w.node("Reshape", [x, shape], name=f"{prefix}/BlockReshape")[0]
            axes = self.w.const(f"{prefix}/BlockAxis", [-1])
            self.blocksums[x] = self.w.node("ReduceSum", [r, axes], name=f"{prefix}/BlockSum", keepdims=0)[0]
        return self.blocksums[x]

    def _minimum_sums(self, x: str, k: int, prefix: str) -> str:
        """The minimum term's input (blocks.pack_minimums): per-32-block sums of x [B, S, K] and MIN_HI
        times them, interleaved -> [B, S, K/16] (computed once per input)."""
        key = x + "#minimum"
        if key not in self.blocksums:
            shape = self.w.const(f"{prefix}/MinBlockShape", [0, 0, k // OFFSET_BLOCK, OFFSET_BLOCK])
            r = self.w.node("Reshape", [x, shape], name=f"{prefix}/MinBlockReshape")[0]
            axes = self.w.const(f"{prefix}/MinBlockAxis", [-1])
            sums = self.w.node("ReduceSum", [r, axes], name=f"{prefix}/MinBlockSum", keepdims=1)[0]  # [B, S, K/32, 1]
            both = self.w.node("Mul", [sums, self.float_tensor(f"{prefix}/MinSlots", np.array([1.0, MIN_HI]))],
                               name=f"{prefix}/MinSlots")[0]  # [B, S, K/32, 2]
            flat = self.w.const(f"{prefix}/MinSlotShape", [0, 0, 2 * k // OFFSET_BLOCK])
            self.blocksums[key] = self.w.node("Reshape", [both, flat], name=f"{prefix}/MinSlotReshape")[0]
        return self.blocksums[key]

    def linear(self, x: str, parts: list[str], base: str, node: str, *, place: str = "body",
               out: str | None = None) -> str:
        """x [B, S, K] times the GGUF weights `parts` (their rows concatenated: q/k/v) -> [B, S, N].
        base: initializer prefix (model.layers.0.attn.qkv_proj.MatMul), node: node prefix
        (/model/layers.0/attn/qkv_proj/MatMul)."""
        forms = [self.plan.form(self.gg.type_name(p), place) for p in parts]
        groups = self.groups(parts)
        if len(groups) > 1:  # neighbours stored alike share one product (q and k of Q4_K beside a Q6_K v)
            outs = [self.linear(x, g, f"{base}.{i}", f"{node}_{i}") for i, g in enumerate(groups)]
            return self.w.node("Concat", outs, [out] if out else 1, name=f"{node}/Concat", axis=-1)[0]
        n_total = sum(self.gg.shape(p)[0] for p in parts)
        k = self.gg.shape(parts[0])[1]
        big = len(parts) == 1 and self.gg.shape(parts[0])[0] * k > CHUNK_VALUES
        form = forms[0]
        for p, f in zip(parts, forms):
            self.report.add(self.gg.type_name(p), f, self.gg.shape(p)[0] * k)
        if form.kind == "float":
            w = np.concatenate([self.gg.floats(p) for p in parts]).T
            name = self.float_tensor(f"{base}.weight", w)
            self.report.bytes_read += w.size * np.dtype(self.np_float).itemsize
            for p in parts:
                self._done(p)
            return self.w.node("MatMul", [x, name], [out] if out else 1, name=node)[0]
        if big:
            encs = None
            first = self._encoded(parts[0], form, 0, 1)
        else:
            encs = [self._encoded(p, form, 0, self.gg.shape(p)[0]) for p in parts]
            first = encs[0]
        bits, block = first.bits, first.block
        tag = f"Q{bits}"
        b_name, s_name = f"{base}.weight_{tag}", f"{base}.weight_scales"
        offsets, zps, mins = [], [], []
        if encs is not None:
            q = np.concatenate([pack(e) for e in encs])
            scales = np.concatenate([e.scales for e in encs])
            if first.offset is not None:
                offsets = [np.concatenate([e.offset for e in encs])]
            if first.integer_minimum:
                mins = [pack_minimums(e) for e in encs]
            if first.zero_points is not None:
                zps = [np.concatenate([pack_zero_points(e) for e in encs])]
            self.w.tensor(b_name, q)
            del q, encs
        else:
            scale_rows = []

            def chunks():
                for lo, hi in self._rows(parts[0]):
                    e = self._encoded(parts[0], form, lo, hi)
                    scale_rows.append(e.scales)
                    if e.offset is not None:
                        offsets.append(e.offset)
                    if e.zero_points is not None:
                        zps.append(pack_zero_points(e))
                    if e.integer_minimum:
                        mins.append(pack_minimums(e))
                    yield pack(e)

            self.w.tensor_rows(b_name, np.uint8, (n_total, k // block, block * bits // 8), chunks())
            scales = np.concatenate(scale_rows)
            offsets = [np.concatenate(offsets)] if offsets else []
            zps = [np.concatenate(zps)] if zps else []
        self.w.tensor(s_name, scales.astype(self.np_float))
        self.report.bytes_read += n_total * k * bits // 8 + scales.size * np.dtype(self.np_float).itemsize
        if place == "body":
            self.report.body_bits[bits] = self.report.body_bits.get(bits, 0) + n_total * k
            self.report.body_blocks[block] = self.report.body_blocks.get(block, 0) + n_total * k
        else:
            self.report.head_bits = bits
        for p in parts:
            self._done(p)
        inputs = [x, b_name, s_name]
        if zps:
            inputs.append(self.w.tensor(f"{base}.weight_zero_points", zps[0]))
            self.report.bytes_read += zps[0].size
        main_out = [out] if out and not offsets and not mins else 1
        y = self.w.node("MatMulNBits", inputs, main_out, name=f"{node}_{tag}", domain="com.microsoft",
                        K=k, N=n_total, bits=bits, block_size=block,
                        accuracy_level=self.plan.settings.accuracy_level)[0]
        if offsets:
            off = self.float_tensor(f"{base}.weight_offset", offsets[0].T)  # [K/32, N]
            self.report.bytes_read += offsets[0].size * np.dtype(self.np_float).itemsize
            sums = self._blocksum(x, k, node.rsplit("/", 1)[0])
            corr = self.w.node("MatMul", [sums, off], name=f"{node}/Offset")[0]
            y = self.w.node("Add", [y, corr], [out] if out else 1, name=f"{node}/OffsetAdd")[0]
        if mins:
            mb = self.w.tensor(f"{base}.weight_minimum_Q4", np.concatenate([b for b, _ in mins]))
            ms = self.w.tensor(f"{base}.weight_minimum_scales", np.concatenate([s for _, s in mins]).astype(self.np_float))
            self.report.bytes_read += sum(b.size + s.size * np.dtype(self.np_float).itemsize for b, s in mins)
            sums = self._minimum_sums(x, k, node.rsplit("/", 1)[0])
            # float32 compute (accuracy level 1): the int8 activations of level 4 would round the block
            # sums to the scale of their largest slot, MIN_HI times the others'
            corr = self.w.node("MatMulNBits", [sums, mb, ms], name=f"{node}/Minimum_Q4", domain="com.microsoft",
                               K=2 * k // OFFSET_BLOCK, N=n_total, bits=4, block_size=2 * 256 // OFFSET_BLOCK,
                               accuracy_level=1)[0]
            y = self.w.node("Add", [y, corr], [out] if out else 1, name=f"{node}/MinimumAdd")[0]
        return y

    def groups(self, parts: list[str], place: str = "body") -> list[list[str]]:
        """`parts` in runs of neighbours with equal signatures: each run can be one MatMulNBits."""
        out: list[list[str]] = []
        last = None
        for p in parts:
            sig = self._signature(p, self.plan.form(self.gg.type_name(p), place))
            if out and sig == last:
                out[-1].append(p)
            else:
                out.append([p])
            last = sig
        return out

    def _signature(self, p: str, form: Form) -> tuple:
        """Tensors with equal signatures are stored alike, so their rows can share one MatMulNBits."""
        from .plan import DECODED_BITS, INTEGER_MINIMUM_TYPES, OFFSET_TYPES

        if form.kind != "exact":
            return (form.kind, form.bits, form.block, form.zero_points)
        t = self.gg.type_name(p)
        return ("exact", DECODED_BITS[t], 16 if t == "Q6_K" else 32, t in OFFSET_TYPES,
                self.plan.minimum == "integer" and t in INTEGER_MINIMUM_TYPES)

    def _done(self, name: str) -> None:
        self.gg.done(name)
        self.on_tensor(name)

    # --- the embedding ----------------------------------------------------------------------------
    def embedding(self, ids: str) -> str:
        name, out = "token_embd.weight", "/model/embed_tokens/Gather/output_0"
        tname = self.gg.type_name(name)
        form = self.plan.form(tname, "embed", tied=self.c.tied)
        v, h = self.gg.shape(name)
        self.report.add(tname, form, v * h)
        if form.kind == "float":
            w = np.concatenate([self.gg.floats(name, lo, hi) for lo, hi in self._rows(name)])
            init = self.float_tensor("model.embed_tokens.weight", w)
            del w
            self._done(name)
            return self.w.node("Gather", [init, ids], [out], name="/model/embed_tokens/Gather")[0]
        first = self._encoded(name, form, 0, 1, "embed")
        bits, block = first.bits, first.block
        scale_rows, offset_rows, zp_rows = [], [], []

        def chunks():
            for lo, hi in self._rows(name):
                e = self._encoded(name, form, lo, hi, "embed")
                scale_rows.append(e.scales)
                if e.offset is not None:
                    offset_rows.append(e.offset)
                if e.zero_points is not None:
                    zp_rows.append(pack_zero_points(e))
                yield pack(e).reshape(hi - lo, -1)

        data = self.w.tensor_rows(f"model.embed_tokens.weight_Q{bits}", np.uint8, (v, h * bits // 8), chunks())
        scales = self.w.tensor("model.embed_tokens.weight_scales", np.concatenate(scale_rows).astype(self.np_float))
        self._done(name)
        gathered = out if not offset_rows else "/model/embed_tokens/Gather_Q/output_0"
        inputs = [data, ids, scales]
        if zp_rows:
            inputs.append(self.w.tensor("model.embed_tokens.weight_zero_points", np.concatenate(zp_rows)))
        self.w.node("GatherBlockQuantized", inputs, [gathered], name=f"/model/embed_tokens/Gather_Q{bits}",
                    domain="com.microsoft", bits=bits, block_size=block, gather_axis=0, quantize_axis=1)
        if offset_rows:
            table = self.float_tensor("model.embed_tokens.weight_offset", np.concatenate(offset_rows))  # [V, H/32]
            p = "/model/embed_tokens"
            rows = self.w.node("Gather", [table, ids], name=f"{p}/OffsetGather")[0]  # [B, S, H/32]
            rows = self.w.node("Unsqueeze", [rows, self.w.const(f"{p}/OffsetAxis", [-1])], name=f"{p}/OffsetUnsqueeze")[0]
            blocks = self.w.node("Reshape", [gathered, self.w.const(f"{p}/BlockShape", [0, 0, h // OFFSET_BLOCK, OFFSET_BLOCK])],
                                 name=f"{p}/BlockReshape")[0]
            summed = self.w.node("Add", [blocks, rows], name=f"{p}/OffsetAdd")[0]
            self.w.node("Reshape", [summed, self.w.const(f"{p}/RowShape", [0, 0, h])], [out], name=f"{p}/RowReshape")
        return out
