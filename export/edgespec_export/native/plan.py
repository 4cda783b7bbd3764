"""Which form each GGUF tensor takes in the bundle: its own blocks (exact), rounded to nearest at the
export's bits, or float. One function decides, per tensor, from the GGUF type, the tensor's place
(body, embedding, lm_head) and what the user asked (`--quant`: none = keep the GGUF's blocks).

The block size, accuracy level and lm_head bits of the re-quantized tensors are the builder path's
own (quantize.QuantSettings, build.DEFAULT_HEAD_BITS), so a change to them applies to both exporters.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..contract import QUANT_BITS
from ..quantize import QuantSettings
from .blocks import DECODERS

OFFSET_TYPES = ("Q4_1", "Q5_1", "Q4_K", "Q5_K")  # blocks with a minimum: an offset term in the graph
FLOAT_TYPES = ("F32", "F16", "BF16")
DECODED_BITS = {"Q4_0": 4, "Q4_1": 4, "Q4_K": 4, "Q5_0": 8, "Q5_1": 8, "Q5_K": 8, "Q6_K": 8, "Q8_0": 8}
INTEGER_MINIMUM_TYPES = ("Q4_K", "Q5_K")  # minimums that are integers with a super-block scale (blocks.offset_to_integer)
MINIMUMS = ("integer", "offset", "zero-point")  # --gguf-minimum
DEFAULT_MINIMUM = "integer"
# Q6_K (8 bits in blocks of 16 with a float32 scale each: 10 bits a weight, the GGUF's 6.56) is rounded
# from its dequantized values to 8 bits in blocks of this size (8.25 bits a weight); None keeps its blocks
DEFAULT_Q6K_BLOCK = 128


@dataclass(frozen=True)
class Form:
    kind: str  # "exact" (the GGUF's blocks), "round" (dequantized, rounded to nearest), "float"
    bits: int = 0  # "round": 4 or 8
    block: int = 0  # "round": the block size (0: the plan's settings.block_size)
    zero_points: bool = False  # "round": min-max with uint8 zero points (blocks.round_min_max), else symmetric

    def label(self, type_name: str, minimum: str = "offset") -> str:
        if self.kind == "exact" and minimum == "zero-point" and type_name in OFFSET_TYPES:
            return f"{type_name} kept, minimum rounded to a zero point ({DECODED_BITS[type_name]}-bit blocks)"
        if self.kind == "exact" and minimum == "integer" and type_name in INTEGER_MINIMUM_TYPES:
            return f"{type_name} kept, minimum as its integers ({DECODED_BITS[type_name]}-bit blocks)"
        if self.kind == "exact":
            return f"{type_name} kept ({DECODED_BITS[type_name]}-bit blocks)"
        if self.kind == "round":
            return (f"{type_name} re-quantized to {self.bits}-bit" + (f", block {self.block}" if self.block else "")
                    + (", zero points" if self.zero_points else ""))
        return f"{type_name} as float"


@dataclass(frozen=True)
class Plan:
    """quant: None keeps the GGUF's blocks wherever they map; "int4"/"int8" sets the bits (a GGUF block
    type that maps exactly at no more bits is still kept); "fp32"/"fp16" stores floats."""

    quant: str | None
    settings: QuantSettings
    # a block minimum (Q4_K, Q4_1, Q5_K, Q5_1): "integer" keeps a k-quant's as the GGUF's integers (a
    # second small MatMulNBits; Q4_1/Q5_1: the offset), "offset" keeps it exact as a float term,
    # "zero-point" rounds it to MatMulNBits' integer zero points (fewest bytes, one more rounding)
    minimum: str = DEFAULT_MINIMUM
    q6k_block: int | None = DEFAULT_Q6K_BLOCK
    fuse: bool = True  # q/k/v and gate/up of one form as one MatMulNBits each (graph.py)
    # the tuner's forms (tune.py): 4-bit GGUF bodies (Q4_K, ...) rounded from their dequantized values to 4
    # bits in blocks of body_block with zero points (0: kept); Q6_K rounded to q6k_bits (8, or 4 with zero points)
    body_block: int = 0
    q6k_bits: int = 8

    def form(self, type_name: str, place: str, tied: bool = False) -> Form:
        """place: "body" (a decoder MatMul), "embed" (token embedding), "head" (lm_head)."""
        if self.quant in ("fp32", "fp16"):
            return Form("float")
        s = self.settings
        head_bits = s.head_bits or s.bits
        if place == "head":
            # the lm_head's node must be a plain MatMulNBits (the logits_to_keep edit slices its input):
            # a type with a minimum is rounded at the head's bits instead
            if type_name in DECODERS and type_name not in OFFSET_TYPES and self._keeps(type_name, head_bits):
                return self._q6k(type_name)
            return Form("round", head_bits)
        bits = s.bits if place == "body" else (head_bits if tied else (s.embed_bits or s.bits))
        if place == "body" and self.body_block and DECODED_BITS.get(type_name) == 4:
            return Form("round", 4, self.body_block, True)
        if type_name in DECODERS and self._keeps(type_name, bits):
            return self._q6k(type_name) if place == "body" else Form("exact")
        if type_name in FLOAT_TYPES or self.quant is not None:
            return Form("round", bits)
        return Form("round", bits)  # Q2_K, Q3_K, IQ*: no exact map

    def _q6k(self, type_name: str) -> Form:
        """A kept block type in a product; Q6_K at 8 bits in blocks of q6k_block unless that is None."""
        if type_name == "Q6_K" and self.q6k_block:
            return Form("round", self.q6k_bits, self.q6k_block, self.q6k_bits == 4)
        return Form("exact")

    def _keeps(self, type_name: str, bits: int) -> bool:
        return self.quant is None or DECODED_BITS[type_name] <= bits


def settings_for(quant: str | None, block_size: int, accuracy_level: int, head_bits: int | None) -> QuantSettings:
    """The builder path's parameters (pipeline options, quantize.py's defaults) for the rounded tensors."""
    from ..quantize import DEFAULT_HEAD_BITS

    q = quant if quant in QUANT_BITS else "int4"
    return QuantSettings(bits=QUANT_BITS[q], block_size=block_size, accuracy_level=accuracy_level,
                         head_bits=head_bits or DEFAULT_HEAD_BITS[q])
