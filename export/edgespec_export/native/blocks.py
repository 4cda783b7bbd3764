"""GGUF block types -> the blocks onnxruntime's MatMulNBits / GatherBlockQuantized read, without a
second rounding where the formats map.

Every weight row [K] of a GGUF tensor is a run of blocks; each block type is decoded here into one
form, `Encoded`: unsigned integers q (4 or 8 bits) in blocks of `block` along K, one float32 scale
per block, onnxruntime's default zero point (2^(bits-1): 8 or 128, so no zero-point tensor), and,
for the types whose blocks carry a minimum, a float32 `offset` per 32-block added on top:

    W[n, k] = scales[n, k // block] * (q[n, k] - zp) + offset[n, k // 32]     (offset: or 0)

| GGUF     | GGUF block                      | here                                 | exact?                     |
|----------|---------------------------------|--------------------------------------|----------------------------|
| Q4_0     | d * (q4 - 8)                    | 4 bits, block 32, scale d            | yes                        |
| Q4_1     | d * q4 + m                      | 4 bits, block 32, offset 8d + m      | q, d yes; offset 1 rounding|
| Q5_0     | d * (q5 - 16)                   | 8 bits, block 32, q5 + 112           | yes                        |
| Q5_1     | d * q5 + m                      | 8 bits, block 32, offset 16d + m     | q, d yes; offset 1 rounding|
| Q8_0     | d * q8                          | 8 bits, block 32, q8 + 128           | yes                        |
| Q4_K     | d*sc * q4 - dmin*m (sub-block 32)| 4 bits, block 32, offset 8 d sc - dmin m | q, d sc yes; offset 1 rounding |
| Q5_K     | d*sc * q5 - dmin*m              | 8 bits, block 32, offset 16 d sc - dmin m | as Q4_K              |
| Q6_K     | d*sc * (q6 - 32) (sub-block 16) | 8 bits, block 16, q6 + 96            | yes                        |
| other    | (F32/F16/BF16, Q2_K, Q3_K, IQ*) | dequantized, rounded to nearest      | re-quantized               |

"offset 1 rounding": the offset is the float32 of a difference of two exact products (an fp16 times a
small integer each), one rounding of at most 2^-24 of its size; the scales and integers are the
GGUF's own. Why the offset and not MatMulNBits' float zero points: onnxruntime's CPU MatMulNBits
does not prepack a weight whose zero points are not uint8 (contrib_ops/cpu/quantization/
matmul_nbits.cc, PrePack returns early on `has_unquantized_zero_point_`), so every call would
dequantize the whole weight to float first; integer zero points would round the minimum. The
offset is applied in the graph as a small float MatMul over per-block sums of the input (graph.py).

Shapes: q uint8 [N, K]; scales float32 [N, K // block]; offset float32 [N, K // 32] or None.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

OFFSET_BLOCK = 32  # the block an offset covers: every GGUF type with a minimum has 32-wide (sub-)blocks
QK_K = 256  # elements of a k-quant super-block


@dataclass
class Encoded:
    bits: int  # 4 or 8
    block: int  # block size along K (16 or 32, or the export's block size when re-quantized)
    q: np.ndarray  # uint8 [N, K], values in [0, 2^bits)
    scales: np.ndarray  # float32 [N, K // block]
    offset: np.ndarray | None  # float32 [N, K // 32], added to every weight of its 32-block
    exact: bool  # the GGUF's own integers and scales (offset: one float32 rounding)
    zero_points: np.ndarray | None = None  # uint8 [N, K // block]: per-block zero points instead of the default
    # a k-quant's minimum as the GGUF stores it (Q4_K, Q5_K): the 6-bit integers m [N, K // 32] and the
    # super-block's float dmin [N, K // 256]; W = scale * (q - zp) - dmin * m when `offset` is None
    mins: np.ndarray | None = None
    min_scales: np.ndarray | None = None
    gguf_zero: int = 0  # the stored value of the GGUF's integer 0 (Q4_K: 0, Q5_K: 112)

    @property
    def zero_point(self) -> int:
        return 1 << (self.bits - 1)

    def dequantize(self) -> np.ndarray:
        """W [N, K] float32, as the kernels compute it (for tests and the reference)."""
        n, k = self.q.shape
        zp = self.zero_point if self.zero_points is None else self.zero_points.astype(np.float32)[:, :, None]
        w = (self.q.astype(np.float32).reshape(n, k // self.block, self.block) - zp)
        w = (w * self.scales[:, :, None]).reshape(n, k)
        if self.offset is not None:
            w = (w.reshape(n, k // OFFSET_BLOCK, OFFSET_BLOCK) + self.offset[:, :, None]).reshape(n, k)
        elif self.integer_minimum:
            m = self.mins.astype(np.float32) * np.repeat(self.min_scales, QK_K // OFFSET_BLOCK, axis=1)
            w = (w.reshape(n, k // OFFSET_BLOCK, OFFSET_BLOCK) - m[:, :, None]).reshape(n, k)
        return w

    @property
    def integer_minimum(self) -> bool:
        """The minimum applied as the GGUF's integers (a second, small MatMulNBits), not an offset."""
        return self.offset is None and self.mins is not None


def _f16(raw: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(raw).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray, half: int) -> np.ndarray:
    """[..., half] bytes -> [..., 2*half] values: low nibbles first, then high (ggml's order)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _rows_blocks(raw: np.ndarray, type_size: int) -> tuple[int, np.ndarray]:
    n = raw.shape[0]
    return n, raw.reshape(n, -1, type_size)


def _q4_0(raw):
    n, b = _rows_blocks(raw, 18)
    d = _f16(b[..., 0:2]).reshape(n, -1)
    q = _nibbles(b[..., 2:18], 16).reshape(n, -1)
    return Encoded(4, 32, q, d, None, True)


def _q4_1(raw):
    n, b = _rows_blocks(raw, 20)
    d = _f16(b[..., 0:2]).reshape(n, -1)
    m = _f16(b[..., 2:4]).reshape(n, -1)
    q = _nibbles(b[..., 4:20], 16).reshape(n, -1)
    return Encoded(4, 32, q, d, (8 * d + m).astype(np.float32), True)


def _q5_low_high(qh: np.ndarray, qs: np.ndarray) -> np.ndarray:
    """Q5 blocks: 4 bytes of high bits (little-endian uint32, bit j = element j) + 16 nibble bytes."""
    bits = np.unpackbits(np.ascontiguousarray(qh), axis=-1, bitorder="little")  # [..., 32]
    return _nibbles(qs, 16) | (bits << 4)


def _q5_0(raw):
    n, b = _rows_blocks(raw, 22)
    d = _f16(b[..., 0:2]).reshape(n, -1)
    q5 = _q5_low_high(b[..., 2:6], b[..., 6:22]).reshape(n, -1)
    return Encoded(8, 32, (q5 + 112).astype(np.uint8), d, None, True)


def _q5_1(raw):
    n, b = _rows_blocks(raw, 24)
    d = _f16(b[..., 0:2]).reshape(n, -1)
    m = _f16(b[..., 2:4]).reshape(n, -1)
    q5 = _q5_low_high(b[..., 4:8], b[..., 8:24]).reshape(n, -1)
    return Encoded(8, 32, (q5 + 112).astype(np.uint8), d, (16 * d + m).astype(np.float32), True)


def _q8_0(raw):
    n, b = _rows_blocks(raw, 34)
    d = _f16(b[..., 0:2]).reshape(n, -1)
    q = (np.ascontiguousarray(b[..., 2:34]).view(np.int8).astype(np.int16) + 128).astype(np.uint8).reshape(n, -1)
    return Encoded(8, 32, q, d, None, True)


def _k_scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K: 12 bytes -> 8 six-bit scales and 8 six-bit minimums per super-block."""
    s = scales.reshape(*scales.shape[:-1], 3, 4)
    d, m, md = s[..., 0, :], s[..., 1, :], s[..., 2, :]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc.astype(np.float32), mn.astype(np.float32)


def _q4_k(raw):
    n, b = _rows_blocks(raw, 144)
    d, dmin = _f16(b[..., 0:2]), _f16(b[..., 2:4])  # [n, S, 1]
    sc, mn = _k_scale_min(b[..., 4:16])  # [n, S, 8]
    qs = b[..., 16:144].reshape(n, -1, 4, 32)  # 4 groups of 64 values: low nibbles 32, then high 32
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(n, -1)
    scale = (d * sc).reshape(n, -1)
    offset = (8 * scale - (dmin * mn).reshape(n, -1)).astype(np.float32)
    return Encoded(4, 32, q, scale.astype(np.float32), offset, True, mins=mn.reshape(n, -1).astype(np.uint8),
                   min_scales=dmin.reshape(n, -1).astype(np.float32), gguf_zero=0)


def _q5_k(raw):
    n, b = _rows_blocks(raw, 176)
    d, dmin = _f16(b[..., 0:2]), _f16(b[..., 2:4])
    sc, mn = _k_scale_min(b[..., 4:16])
    qh = b[..., 16:48]  # [n, S, 32]: bit j of byte l = high bit of value 32 j + l
    qs = b[..., 48:176].reshape(n, -1, 4, 32)
    low = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(n, -1, 8, 32)
    high = (qh[..., None, :] >> np.arange(8, dtype=np.uint8)[:, None]) & 1  # [n, S, 8, 32]
    q5 = (low | (high << 4)).reshape(n, -1)
    scale = (d * sc).reshape(n, -1)
    offset = (16 * scale - (dmin * mn).reshape(n, -1)).astype(np.float32)
    return Encoded(8, 32, (q5 + 112).astype(np.uint8), scale.astype(np.float32), offset, True,
                   mins=mn.reshape(n, -1).astype(np.uint8), min_scales=dmin.reshape(n, -1).astype(np.float32),
                   gguf_zero=112)


def _q6_k(raw):
    n, b = _rows_blocks(raw, 210)
    ql = b[..., 0:128].reshape(n, -1, 2, 64)  # two halves of 128 values
    qh = b[..., 128:192].reshape(n, -1, 2, 32)
    scales = np.ascontiguousarray(b[..., 192:208]).view(np.int8).astype(np.float32)  # [n, S, 16]
    d = _f16(b[..., 208:210])  # [n, S, 1]
    low = np.concatenate([ql & 0x0F, ql >> 4], axis=-1).reshape(n, -1, 2, 4, 32)  # value 32 j + l of a half
    high = (qh[..., None, :] >> (2 * np.arange(4, dtype=np.uint8))[:, None]) & 3  # [n, S, 2, 4, 32]
    q6 = (low | (high << 4)).reshape(n, -1)
    return Encoded(8, 16, (q6 + 96).astype(np.uint8), (d * scales).reshape(n, -1).astype(np.float32), None, True)


DECODERS = {"Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1, "Q8_0": _q8_0, "Q4_K": _q4_k,
            "Q5_K": _q5_k, "Q6_K": _q6_k}


def decode(raw: np.ndarray, type_name: str) -> Encoded | None:
    """raw: uint8 [N, bytes per row] of a GGUF tensor of `type_name`; None for a type without an exact map."""
    fn = DECODERS.get(type_name)
    return None if fn is None else fn(np.ascontiguousarray(raw))


def round_to_nearest(w: np.ndarray, bits: int, block: int) -> Encoded:
    """Float W [N, K] -> symmetric blocks, round to nearest (the builder path's scheme: one scale per
    block, the default zero point, the largest magnitude mapped to the end of the range)."""
    w = np.asarray(w, dtype=np.float32)
    n, k = w.shape
    if k % block:
        raise ValueError(f"a row of {k} values is not a whole number of blocks of {block}")
    blocks = w.reshape(n, k // block, block)
    levels = (1 << (bits - 1)) - 1  # 7 or 127
    scale = np.abs(blocks).max(axis=2) / levels
    safe = np.where(scale == 0, 1.0, scale)
    zp = 1 << (bits - 1)
    q = (np.clip(np.rint(blocks / safe[..., None]), -zp, levels) + zp).astype(np.uint8).reshape(n, k)
    return Encoded(bits, block, q, scale.astype(np.float32), None, False)


def round_min_max(w: np.ndarray, bits: int, block: int) -> Encoded:
    """Float W [N, K] -> asymmetric blocks: each block's range (widened to hold 0) mapped onto 0..2^bits-1
    with a uint8 zero point per block (prepacked by the CPU kernel). The tuner's re-quantized forms
    (tune.py): at blocks of 64 or 128 a one-sided block keeps all 16 levels, where the symmetric scheme
    spends half of them on values the block does not hold."""
    w = np.asarray(w, dtype=np.float32)
    n, k = w.shape
    if k % block:
        raise ValueError(f"a row of {k} values is not a whole number of blocks of {block}")
    blocks = w.reshape(n, k // block, block)
    lo, hi = np.minimum(blocks.min(axis=2), 0.0), np.maximum(blocks.max(axis=2), 0.0)
    top = (1 << bits) - 1
    scale = (hi - lo) / top
    safe = np.where(scale == 0, 1.0, scale)
    zp = np.clip(np.rint(-lo / safe), 0, top)
    q = np.clip(np.rint(blocks / safe[..., None]) + zp[..., None], 0, top).astype(np.uint8).reshape(n, k)
    return Encoded(bits, block, q, scale.astype(np.float32), None, False, zp.astype(np.uint8))


def offset_to_zero_points(e: Encoded) -> Encoded:
    """The block minimum as an integer zero point (MatMulNBits' uint8 zero points, prepacked by the CPU
    kernel) instead of the float offset term: z = round(zp - offset / scale), one rounding of the
    minimum (at most half a step of the block's scale), 4 bits per block instead of 32 per 32 weights."""
    if e.offset is None:
        return e
    if e.block != OFFSET_BLOCK:
        raise ValueError(f"a minimum per {OFFSET_BLOCK} weights needs blocks of {OFFSET_BLOCK}, not {e.block}")
    safe = np.where(e.scales == 0, 1.0, e.scales)
    z = np.clip(np.rint(e.zero_point - e.offset / safe), 0, (1 << e.bits) - 1).astype(np.uint8)
    return Encoded(e.bits, e.block, e.q, e.scales, None, False, z)


def offset_to_integer(e: Encoded) -> Encoded:
    """A k-quant's minimum kept as the GGUF's own integers: the main product gets uint8 zero points at
    the GGUF's integer 0 (W' = scale * q_gguf, prepacked by the CPU kernel), and the minimum term
    dmin * m is its own MatMulNBits over the input's block sums (pack_minimums). Exact: no rounding of
    any GGUF number. Types whose minimum is a float per block (Q4_1, Q5_1) keep the offset."""
    if e.offset is None or e.mins is None:
        return e
    z = np.full(e.scales.shape, e.gguf_zero, dtype=np.uint8)
    return Encoded(e.bits, e.block, e.q, e.scales, None, True, z, e.mins, e.min_scales, e.gguf_zero)


# The minimum term  sum_j dmin[s(j)] * m[j] * blocksum32(x)[j]  as one 4-bit MatMulNBits of block 16 (the
# kernels' smallest block; one block = one super-block's 8 minimums, so its scale is the GGUF's dmin):
# each 6-bit m = lo + 8 hi (lo, hi in 0..7) takes two slots, lo against blocksum32(x)[j] and hi against
# 8 * blocksum32(x)[j] (the graph interleaves the two sums: [B, S, K/16]). Stored with the default zero
# point 8: lo + 8 and hi + 8, 4 bits each. 0.375 bits a weight (float32 dmin), vs 1 for a float32 offset.
MIN_SLOTS = 2 * QK_K // OFFSET_BLOCK  # 16 slots, one block, per super-block
MIN_HI = 8  # the second slot's input is MIN_HI times the block sum


def pack_minimums(e: Encoded) -> tuple[np.ndarray, np.ndarray]:
    """(B uint8 [N, K // 256, 8], scales float32 [N, K // 256]) of the minimum term's MatMulNBits: K' = K / 16,
    block 16, 4 bits, scale -dmin (the term is subtracted)."""
    m = e.mins
    n = m.shape[0]
    slots = np.stack([(m % MIN_HI) + 8, (m // MIN_HI) + 8], axis=-1).reshape(n, -1, MIN_SLOTS).astype(np.uint8)
    packed = slots[..., 0::2] | (slots[..., 1::2] << 4)
    return np.ascontiguousarray(packed), (-e.min_scales).astype(np.float32)


def pack_zero_points(e: Encoded) -> np.ndarray:
    """MatMulNBits' / GatherBlockQuantized's zero points: uint8 [N, ceil(blocks * bits / 8)], 4-bit pairs
    low nibble first (the last byte's high nibble padding when the block count is odd)."""
    z = e.zero_points
    if e.bits == 8:
        return np.ascontiguousarray(z)
    if z.shape[1] % 2:
        z = np.concatenate([z, np.zeros((z.shape[0], 1), np.uint8)], axis=1)
    return np.ascontiguousarray(z[:, 0::2] | (z[:, 1::2] << 4))


def pack(e: Encoded) -> np.ndarray:
    """MatMulNBits' B: uint8 [N, K // block, block * bits // 8], 4-bit pairs low nibble first."""
    n, k = e.q.shape
    q = e.q.reshape(n, k // e.block, e.block)
    if e.bits == 8:
        return np.ascontiguousarray(q)
    return np.ascontiguousarray(q[..., 0::2] | (q[..., 1::2] << 4))
