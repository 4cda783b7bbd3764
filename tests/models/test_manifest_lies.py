"""Manifests that lie with a recomputed digest (the digest is unkeyed: it catches damage, not an
edit). Each lie the probe found, and a few more, must be one clear line from `verify`, a
BundleCorrupt from the loader, and exit 78 from `serve` (so systemd does not restart it in a loop)."""
from __future__ import annotations

import pytest

from edgespec.cli.main import main
from edgespec.errors import BundleCorrupt
from edgespec.models.bundle import Bundle
from edgespec.models.graphfacts import read_graph_io
from edgespec.models.bundlecheck import verify_bundle
from edgespec.models.manifest import FORMAT_VERSION, READ_VERSIONS
from helpers.manifests import rewrite_manifest


def _drop_tokenizer_json(d):
    d["tokenizer"]["files"].remove("tokenizer.json")
    del d["files"]["tokenizer.json"]


def _drop_weights_listing(d):
    del d["files"]["target/model.onnx.data"]


def _tok(key, value):
    return lambda d: d["tokenizer"].update({key: value})


def _target(key, value):
    return lambda d: d["models"]["target"].update({key: value})


# (name, edit of the manifest, files to delete, the one line expected)
LIES = [
    ("layers", lambda d: d["models"]["target"].update(layers=3), [],
     "target/model.onnx: manifest models.target.layers is 3, the graph has 2 (past_key_values.{i}.key inputs)"),
    ("head_dim", lambda d: d["models"]["target"].update(head_dim=17), [],
     "target/model.onnx: manifest models.target.head_dim is 17, the graph's attention has head_dim 16"),
    ("kv_heads", lambda d: d["models"]["draft"].update(kv_heads=4), [],
     "draft/model.onnx: manifest models.draft.kv_heads is 4, the graph's cache has 2 heads"),
    ("kv_dtype", lambda d: d["models"]["target"].update(kv_dtype="int3"), [],
     "manifest.json: models.target.kv_dtype 'int3' is not one of float32, float16, bfloat16"),
    ("kv_dtype_valid_but_wrong", lambda d: d["models"]["target"].update(kv_dtype="float16"), [],
     # two facts: the graph's cache is not float16, and a cpu-flavor graph must have a float32 one
     ("target/model.onnx: past_key_values.0.key is float32, the manifest says float16",
      "target/model.onnx: the cpu flavor has a float32 KV cache, the manifest says float16")),
    ("input_name", lambda d: d["models"]["target"].update(input_ids="tokens"), [],
     "target/model.onnx: manifest models.target.input_ids names input 'tokens', which the graph does not have"),
    ("tokenizer_json", _drop_tokenizer_json, ["tokenizer.json"],
     "manifest.json: 'tokenizer.json' is not listed (the runtime loads the tokenizer from it)"),
    ("weights_file", _drop_weights_listing, ["target/model.onnx.data"],
     "target/model.onnx: its weights file 'target/model.onnx.data' is not listed in the manifest"),
    # the probe's lies (issue 23): each field typed and range-checked where it is read
    ("eos_empty", _tok("eos_ids", []), [],
     "manifest.json: tokenizer.eos_ids is empty: generation would never stop at an end token"),
    ("eos_past_vocab", _tok("eos_ids", [999999]), [],
     "manifest.json: tokenizer.eos_ids holds token id 999999, outside the vocabulary [0, 400)"),
    ("eos_negative", _tok("eos_ids", [-1]), [],
     "manifest.json: tokenizer.eos_ids holds token id -1, outside the vocabulary [0, 400)"),
    ("eos_string", _tok("eos_ids", "2"), [], "manifest.json: tokenizer.eos_ids must be a list of integers, got '2'"),
    ("eos_float", _tok("eos_ids", [2.5]), [], "manifest.json: tokenizer.eos_ids must be a list of integers, got [2.5]"),
    ("eos_null", _tok("eos_ids", None), [], "manifest.json: tokenizer.eos_ids must be a list of integers, got None"),
    ("bos_past_vocab", _tok("bos_id", 999999), [],
     "manifest.json: tokenizer.bos_id holds token id 999999, outside the vocabulary [0, 400)"),
    ("usable_vocab", _tok("usable_vocab", "x"), [], "manifest.json: tokenizer.usable_vocab must be an integer, got 'x'"),
    ("usable_over_rows", _tok("usable_vocab", 513), [],
     "manifest.json: tokenizer.usable_vocab is 513, more than the target model's 512 logits rows"),
    ("chat_template", _tok("chat_template", 5), [], "manifest.json: tokenizer.chat_template must be a string or null, got 5"),
    ("past_key_int", _target("past_key", 5), [], "manifest.json: models.target.past_key must be a string, got 5"),
    ("past_key_pattern", _target("past_key", "past_key_values.%d.key%s"), [],
     "manifest.json: models.target.past_key 'past_key_values.%d.key%s' must hold one '%d' (the layer number) and no "
     "other '%'"),
    ("logits_list", _target("logits", []), [], "manifest.json: models.target.logits must be a string, got []"),
    ("path_int", _target("path", 123), [], "manifest.json: models.target.path must be a string, got 123"),
    ("max_context", _target("max_context", 1), [],
     "manifest.json: models.target.max_context must be from 16 to 16,777,216, got 1"),
    ("position_ids_null", _target("position_ids", None), [],
     f"manifest.json: models.target.position_ids is null, but format_version {FORMAT_VERSION} graphs take it "
     "(docs/graph-contract.md)"),
    ("attention_bias_null", _target("attention_bias", None), [],
     f"manifest.json: models.target.attention_bias is null, but format_version {FORMAT_VERSION} graphs take it "
     "(docs/graph-contract.md)"),
    ("skip_string", _target("self_draft", {"skip": "abc"}), [],
     "manifest.json: models.target.self_draft.skip must be a list of layer numbers from 1 to 1, got 'abc'"),
    ("format_version_bool", lambda d: d.update(format_version=True), [],
     f"manifest.json: format_version True is not supported by this edgespec (reads {', '.join(map(str, READ_VERSIONS))})"),
    ("format_1_over_newer_graphs", lambda d: d.update(format_version=1), [],
     tuple(f"{r}/model.onnx: the graph takes input 'position_ids', which manifest models.{r} does not name (a manifest "
           "of another format_version than the graph's contract? re-export the bundle)" for r in ("target", "draft"))),
]


@pytest.fixture
def lying(tiny_bundle, bundle_copy):
    def make(name):
        _, edit, delete, line = next(c for c in LIES if c[0] == name)
        b = bundle_copy(tiny_bundle, name)
        rewrite_manifest(b, edit)
        for rel in delete:
            (b / rel).unlink()
        return b, line
    return make


def test_the_untouched_bundle_is_consistent(tiny_bundle):
    assert verify_bundle(tiny_bundle)[1] == []


@pytest.mark.parametrize("name", [c[0] for c in LIES])
def test_each_lie_is_one_clear_line_from_verify_and_the_loader(lying, name, capsys):
    b, line = lying(name)
    lines = list(line) if isinstance(line, tuple) else [line]
    assert verify_bundle(b)[1] == lines
    with pytest.raises(BundleCorrupt) as e:
        Bundle.open(b, verify=False)  # caught without the sha256 pass too (a service restart)
    assert e.value.problems == lines
    assert main(["verify", str(b)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out == [f"{b}: {x}" for x in lines] + [f"{b}: NOT OK ({len(lines)} problem(s))"]


@pytest.mark.parametrize("name", ["layers", "head_dim", "kv_dtype", "tokenizer_json", "eos_past_vocab", "path_int"])
def test_serve_exits_78_on_each_lie(lying, name, capsys):
    b, line = lying(name)
    assert main(["serve", str(b), "--port", "0", "--no-warmup"]) == 78
    err = capsys.readouterr().err
    errors = [x for x in err.splitlines() if x.startswith("edgespec serve: error:")]
    assert len(errors) == 1 and "failed verification (1 problem(s))" in errors[0], err
    assert line in err


def test_graph_reader_needs_no_onnx_and_matches_it(tiny_bundle):
    io = read_graph_io(tiny_bundle / "target" / "model.onnx")
    onnx = pytest.importorskip("onnx")  # the reader itself does not use it: compare with it where it is installed
    m = onnx.load(str(tiny_bundle / "target" / "model.onnx"), load_external_data=False)
    assert list(io.inputs) == [i.name for i in m.graph.input]
    assert list(io.outputs) == [o.name for o in m.graph.output]
    for vi in m.graph.input:
        dims = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in vi.type.tensor_type.shape.dim]
        assert io.inputs[vi.name].dims == dims
    assert io.attention_shape() == (4, 2, 16)
    assert io.external_files == {"model.onnx.data"}


def test_a_file_that_is_not_onnx_is_one_line(tiny_bundle, bundle_copy):
    b = bundle_copy(tiny_bundle)
    g = b / "target" / "model.onnx"
    g.write_bytes(b"\xff" * 64)
    rewrite_manifest(b, lambda d: d["files"]["target/model.onnx"].update(
        size=64, sha256=__import__("hashlib").sha256(b"\xff" * 64).hexdigest()))
    problems = verify_bundle(b)[1]
    assert len(problems) == 1 and problems[0].startswith("target/model.onnx: not a readable ONNX graph")
