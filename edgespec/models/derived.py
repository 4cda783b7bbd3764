"""Manifest facts that can be derived from the graph or a bundle file, derived and compared.

graphfacts.py checks the facts the graph's inputs and outputs state (names, layers, heads, cache and
logits dtypes). This module derives the rest from the graph's nodes and initializers, and from the
vocabulary maps' headers, and refuses a manifest that disagrees, naming both values:

- activation_dtype: the element type of the rotary table (`cos_cache`), which the builder writes in
  the graph's activation type (float32 for the cpu flavor, float16 for cuda);
- max_context: at most the rotary table's rows (positions past them have no rotation to apply);
- quant, block_size, accuracy_level, head_bits: the MatMulNBits nodes' attributes (`bits`: one value
  for int4/int8, 4 and 8 side by side for "mixed"; `block_size`, `accuracy_level`; the lm_head is the
  one whose N is the logits rows); an fp32 or fp16 model has no MatMulNBits and its MatMul weights are
  of that type;
- a vocabulary map (models.draft.vocab_map, heads.vocab_map): a numpy array of one distinct integer id
  per logits row, each inside the usable vocabulary;
- usable_vocab: the tokenizer's size, capped by every model's logits rows (what export records).

Each check skips when the graph does not carry what it derives from (a builder that names its rotary
table otherwise): it can only refuse a disagreement it can see.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from .graphfacts import GraphIO, read_graph_io

QUANT_BITS = {"int4": 4, "int8": 8}  # MatMulNBits `bits` of each quantized QUANTS entry
FLOAT_QUANTS = {"fp32": "float32", "fp16": "float16"}  # the MatMul weights' type of each float QUANTS entry
ROTARY_TABLE = "cos_cache"  # the builder's rotary cosine table: [max positions, head_dim / 2]
MAX_MAP_BYTES = 64 << 20  # a vocabulary map is 4 or 8 bytes per logits row (a 16 M-row vocabulary at most)


def graph_problems(root: Path, role: str, facts: Any) -> list[str]:
    """One line per derived fact of models.<role> (one graph) the graph contradicts."""
    rel = facts.path
    try:
        io = read_graph_io(root / rel)
    except Exception:  # noqa: BLE001 - graphfacts.model_problems has said why, one line
        return []
    where = f"{rel}: manifest models.{role}"
    out = []
    table = io.initializer_dims.get(ROTARY_TABLE)
    act = io.value_types.get(ROTARY_TABLE)
    said_act = facts.activation_dtype or facts.kv_dtype  # ModelFacts: activation_dtype None means kv_dtype
    if act in ("float32", "float16", "bfloat16") and act != said_act:
        field = "activation_dtype" if facts.activation_dtype else "activation_dtype (unset: kv_dtype)"
        out.append(f"{where}.{field} is {said_act}, the graph's activations are {act} ({ROTARY_TABLE})")
    if table and len(table) == 2 and facts.max_context > table[0]:
        out.append(f"{where}.max_context is {facts.max_context}, the graph's rotary table covers {table[0]} positions")
    return out + _quant_problems(io, where, facts)


def _quant_problems(io: GraphIO, where: str, facts: Any) -> list[str]:
    nbits = [n for n in io.nodes if n.op_type == "MatMulNBits"]
    head = [n for n in nbits if n.ints.get("N") == facts.vocab_size]
    body = [n for n in nbits if n not in head]
    out = []
    bits = sorted({n.ints.get("bits", 4) for n in body})  # MatMulNBits' bits default is 4
    if facts.quant in QUANT_BITS:
        if bits != [QUANT_BITS[facts.quant]]:
            found = "no quantized MatMul (MatMulNBits)" if not bits else f"MatMulNBits of {'/'.join(map(str, bits))} bits"
            out.append(f"{where}.quant is {facts.quant}, the graph has {found}")
    elif facts.quant == "mixed":  # a GGUF's blocks carried over: 4- and 8-bit MatMulNBits side by side
        if not bits or not set(bits) <= set(QUANT_BITS.values()):
            found = "no quantized MatMul (MatMulNBits)" if not bits else f"MatMulNBits of {'/'.join(map(str, bits))} bits"
            out.append(f"{where}.quant is mixed (4- and 8-bit blocks), the graph has {found}")
    elif facts.quant in FLOAT_QUANTS:
        if bits:
            out.append(f"{where}.quant is {facts.quant}, the graph's MatMulNBits are {'/'.join(map(str, bits))}-bit")
        weights = {io.value_types.get(n.inputs[1]) for n in io.nodes if n.op_type == "MatMul" and len(n.inputs) > 1}
        weights = sorted(w for w in weights if w in ("float32", "float16", "bfloat16"))
        if weights and FLOAT_QUANTS[facts.quant] not in weights:
            out.append(f"{where}.quant is {facts.quant}, the graph's MatMul weights are {'/'.join(weights)}")
    for attr, value in (("block_size", facts.block_size), ("accuracy_level", facts.accuracy_level)):
        found = sorted({n.ints[attr] for n in nbits if attr in n.ints})
        if found and value not in found:
            out.append(f"{where}.{attr} is {_v(value)}, the graph's MatMulNBits use {'/'.join(map(str, found))}")
        elif not nbits and value is not None:
            out.append(f"{where}.{attr} is {value}, the graph has no quantized MatMul (MatMulNBits) to have one")
    head_bits = sorted({n.ints.get("bits", 4) for n in head})
    if not nbits and facts.head_bits is not None:
        out.append(f"{where}.head_bits is {facts.head_bits}, the graph has no quantized MatMul (MatMulNBits)")
    if head_bits and facts.head_bits is not None and head_bits != [facts.head_bits]:
        out.append(f"{where}.head_bits is {facts.head_bits}, the graph's lm_head MatMulNBits is "
                   f"{'/'.join(map(str, head_bits))}-bit")
    return out


def _v(value: Any) -> str:
    return "null" if value is None else str(value)


def map_problems(root: Path, field: str, rel: str, rows: int, usable: int) -> list[str]:
    """A vocabulary map (`field` names it, e.g. "models.draft.vocab_map"): a numpy .npy of `rows`
    distinct integer token ids, each below `usable`. Read header first: a lying shape is refused
    before any data is."""
    import numpy as np

    path = root / rel
    where = f"manifest.json: {field} {rel!r}"
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read(f, max_header_size=10_000)
    except Exception as e:  # noqa: BLE001 - not a numpy file at all: one line
        return [f"{where} is not a numpy array file ({type(e).__name__})"]
    if len(shape) != 1 or not np.issubdtype(dtype, np.integer) or dtype.itemsize * rows > MAX_MAP_BYTES:
        return [f"{where} must be {rows} integer ids (one per logits row), the file holds {dtype} of shape {shape}"]
    if shape[0] != rows:
        return [f"{where} holds {shape[0]} ids, the graph's logits have {rows} rows"]
    m = np.load(path, allow_pickle=False, mmap_mode="r").astype(np.int64)
    if rows and (m.min() < 0 or m.max() >= usable):
        return [f"{where} holds ids {m.min()}..{m.max()}, outside the usable vocabulary [0, {usable})"]
    if np.unique(m).size != rows:
        return [f"{where} names a token id twice"]
    return []


def bundle_map_problems(root: Path, manifest: Any) -> list[str]:
    """Every vocabulary map of the bundle against the graph rows it indexes."""
    usable = manifest.tokenizer.usable_vocab
    out = []
    draft = manifest.models.get("draft")
    if draft is not None and draft.vocab_map:
        out += map_problems(root, "models.draft.vocab_map", draft.vocab_map, draft.vocab_size, usable)
    if manifest.heads is not None:
        out += map_problems(root, "heads.vocab_map", manifest.heads["vocab_map"], manifest.heads["kept"], usable)
    return out


def usable_problem(manifest: Any, tokenizer_size: int) -> str | None:
    """usable_vocab derived as export derives it: the tokenizer's size capped by the logits rows of the
    target and of an unpruned draft (a pruned draft's map says which ids it scores)."""
    rows = [f.vocab_size for r, f in manifest.models.items() if not (r == "draft" and f.vocab_map)]
    want = min([tokenizer_size, *rows])
    got = manifest.tokenizer.usable_vocab
    if got == want:
        return None
    return (f"manifest.json: tokenizer.usable_vocab is {got}, the bundle's is {want} (tokenizer.json has "
            f"{tokenizer_size} tokens, the models' logits have {'/'.join(map(str, rows))} rows)")
