"""OnnxEmbedder (the Embedder protocol on onnxruntime) over an embedder folder exported from a tiny random
BERT: vectors, batching, truncation, token arrays, and every folder that lies refused with one line."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

pytest.importorskip("onnx")
from edgespec.errors import InvalidRequest  # noqa: E402
from edgespec.docs import onnx_embedder  # noqa: E402
from edgespec.docs.embedder import Embedder, load_embedder  # noqa: E402
from edgespec.docs.embedder_folder import EmbedderError  # noqa: E402

TEXTS = ["the museum opens at nine", "tickets for children are free", "where is the lift?", "", "a"]


@pytest.fixture
def folder(tiny_embedder_dir, tmp_path):
    dest = tmp_path / "emb"
    shutil.copytree(tiny_embedder_dir, dest)
    return dest


def test_it_is_the_protocol_and_gives_unit_vectors_independent_of_batch(tiny_embedder_dir, monkeypatch):
    e = load_embedder(tiny_embedder_dir)
    protocol: Embedder = e  # structural: model_id, dim, embed(texts)
    assert callable(protocol.embed)
    assert (e.model_id, e.dim, e.max_tokens) == ("tiny-BERT/int8", 32, 64)
    v = e.embed(TEXTS)
    assert v.shape == (5, 32) and v.dtype == np.float32
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    monkeypatch.setattr(onnx_embedder, "BATCH", 2)  # other batch-mates, other padding
    w = e.embed(TEXTS[::-1])[::-1]
    assert np.allclose(v, w, atol=1e-5)
    assert float(v[0] @ v[1]) < 0.999  # different texts, different vectors


def test_empty_input_is_zero_rows(tiny_embedder_dir):
    assert load_embedder(tiny_embedder_dir).embed([]).shape == (0, 32)


def test_long_texts_are_truncated_to_max_tokens_and_say_so(tiny_embedder_dir):
    e = load_embedder(tiny_embedder_dir)
    got = e.encode(["museum " * 200, "museum"])
    assert got.tokens == [64, 3] and got.truncated == [True, False]
    head = e.encode(["museum " * 62])  # exactly 64 with [CLS] and [SEP]: nothing cut
    assert head.tokens == [64] and head.truncated == [False]
    assert float(got.vectors[0] @ head.vectors[0]) > 0.99999  # what was cut did not count


def test_token_arrays_give_the_text_vectors(tiny_embedder_dir):
    e = load_embedder(tiny_embedder_dir)
    ids = [e.tokenize(t) for t in TEXTS[:3]]
    assert np.allclose(e.encode_ids(ids).vectors, e.embed(TEXTS[:3]), atol=1e-6)
    with pytest.raises(InvalidRequest, match=r"input\[1\]\[0\] is 99999: token ids are integers in 0\.\.\d+"):
        e.encode_ids([[5], [99999]])
    with pytest.raises(InvalidRequest, match=r"input\[0\] is str, expected a list of token ids"):
        e.encode_ids(["museum"])


@pytest.mark.parametrize("bad, match", [
    ("just text", r"texts must be a list of strings, got str"),
    (["ok", 3], r"input\[1\] is int, expected a string"),
])
def test_bad_texts_are_one_line_errors(tiny_embedder_dir, bad, match):
    with pytest.raises(InvalidRequest, match=match):
        load_embedder(tiny_embedder_dir).embed(bad)


def _edit_manifest(folder, **changes):
    p = folder / "manifest.json"
    d = json.loads(p.read_text())
    d.update(changes)
    p.write_text(json.dumps(d))


@pytest.mark.parametrize("lie, match", [
    ("weights", r"model.onnx: sha256 [0-9a-f]{16}… does not match the manifest's"),
    ("size", r"tokenizer.json: size \d+ bytes, manifest says \d+"),
    ("stray", r"notes.txt: present but not listed in the manifest"),
    ("missing", r"model.onnx: missing"),
    ("no-manifest", r"manifest.json: missing"),
    ("garbage", r"manifest.json: unreadable JSON"),
    ("bundle", r"format is None, not 'edgespec-embedder': not an embedder folder"),
    ("dim", r"dim is str, expected int"),
    ("max-tokens", r"max_tokens 100000 is outside 8\.\.512"),
    ("symlink", r"tokenizer.json: a symbolic link out of the bundle"),
])
def test_a_folder_that_lies_is_refused_with_one_line(folder, tmp_path, lie, match):
    if lie == "weights":
        raw = bytearray((folder / "model.onnx").read_bytes())
        raw[-10] ^= 0xFF
        (folder / "model.onnx").write_bytes(bytes(raw))
    elif lie == "size":
        with open(folder / "tokenizer.json", "a") as f:
            f.write(" ")
    elif lie == "stray":
        (folder / "notes.txt").write_text("hi")
    elif lie == "missing":
        (folder / "model.onnx").unlink()
    elif lie == "no-manifest":
        (folder / "manifest.json").unlink()
    elif lie == "garbage":
        (folder / "manifest.json").write_text("{not json")
    elif lie == "bundle":
        (folder / "manifest.json").write_text(json.dumps({"schema_version": 3, "models": {}}))
    elif lie == "dim":
        _edit_manifest(folder, dim="384")
    elif lie == "max-tokens":
        _edit_manifest(folder, max_tokens=100000)
    elif lie == "symlink":
        outside = tmp_path / "elsewhere.json"
        shutil.move(folder / "tokenizer.json", outside)
        (folder / "tokenizer.json").symlink_to(outside)
    with pytest.raises(EmbedderError, match=match) as e:
        load_embedder(folder)
    assert "\n" not in str(e.value) and str(e.value).startswith(f"embedder {folder} refused: ")


def test_names_resolve_under_the_home_and_absent_ones_say_the_pull(tiny_embedder_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    with pytest.raises(EmbedderError, match=r"embedder all-minilm-l6-v2 is not in .*embedders: `edgespec pull "
                                            r"all-minilm-l6-v2` fetches and exports it"):
        load_embedder()  # the default
    with pytest.raises(EmbedderError, match=r"'gpt-embed': not a folder and not a known embedding model \(all-minilm-l6-v2, "
                                            r"multilingual-e5-small\)"):
        load_embedder("gpt-embed")
    with pytest.raises(EmbedderError, match=r"embedder /nowhere/x: no such folder"):
        load_embedder("/nowhere/x")
    shutil.copytree(tiny_embedder_dir, tmp_path / "embedders" / "all-minilm-l6-v2")
    assert load_embedder("minilm").model_id == "tiny-BERT/int8"  # the alias, found by name


def test_runs_are_cut_by_rows_and_by_padded_tokens(monkeypatch):
    monkeypatch.setattr(onnx_embedder, "BATCH", 3)
    monkeypatch.setattr(onnx_embedder, "BATCH_TOKENS", 10)
    lengths = [2, 2, 2, 2, 5, 5, 9]
    assert onnx_embedder._batches(list(range(7)), lengths) == [[0, 1, 2], [3, 4], [5], [6]]


def test_an_index_finds_its_embedder_by_model_id(tiny_embedder_dir, tmp_path, monkeypatch):
    from edgespec.docs.onnx_embedder import open_embedder

    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    with pytest.raises(EmbedderError, match=r"no embedder folder under .*embedders holds tiny-BERT/int8: `edgespec pull minilm`"):
        open_embedder("tiny-BERT/int8")
    shutil.copytree(tiny_embedder_dir, tmp_path / "embedders" / "some-name")
    assert open_embedder("tiny-BERT/int8").folder == tmp_path / "embedders" / "some-name"
    with pytest.raises(EmbedderError, match=r"holds tiny-BERT/float32"):
        open_embedder("tiny-BERT/float32")


def test_files_bytes_finds_the_embedder_an_index_names_without_loading_it(tiny_embedder_dir, tmp_path, monkeypatch):
    from edgespec.docs.embedder_folder import files_bytes

    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    index = tmp_path / "index"
    index.mkdir()
    (index / "manifest.json").write_text(json.dumps({"embedder": {"model_id": "tiny-BERT/int8"}}))
    size = (index / "manifest.json").stat().st_size
    assert files_bytes(docs=index) == (0, size)  # not pulled: the index's own loading says why
    shutil.copytree(tiny_embedder_dir, tmp_path / "embedders" / "tiny")
    files = sum(p.stat().st_size for p in tiny_embedder_dir.iterdir() if p.name != "manifest.json")
    assert files_bytes(docs=index) == (files, size)
    assert files_bytes(embedder=tiny_embedder_dir) == (files, 0)
    with pytest.raises(EmbedderError, match="no such folder"):
        files_bytes(embedder="/nowhere/x")
