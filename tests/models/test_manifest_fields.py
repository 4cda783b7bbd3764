"""Every manifest field read against the graph it describes: the lies a hostile probe found passing
`verify` and being served (defaults, usable_vocab, drafting, activation dtype, block size, a target
vocab_map, parity numbers, a huge id list), each with a recomputed digest. Each must be one line from
`verify` (exit 1) naming the field and the value it should have, a BundleCorrupt from the loader, and
exit 78 from `serve`."""
from __future__ import annotations

import numpy as np
import pytest

from edgespec.cli.main import main
from edgespec.errors import BundleCorrupt
from edgespec.models.bundle import Bundle, read_bundle
from edgespec.limits import DRAFT_MODES, K_LIMIT
from helpers.manifests import rewrite_manifest

MODES = ", ".join(DRAFT_MODES)


def _set(path, value):
    def edit(d):
        obj = d
        for k in path[:-1]:
            obj = obj[k]
        obj[path[-1]] = value
    return edit


def _target(key, value):
    return _set(("models", "target", key), value)


# (name, bundle fixture, edit, the one line expected)
LIES = [
    ("max_len_3", "tiny_bundle", _set(("defaults", "max_len"), 3),
     "manifest.json: defaults.max_len must be an integer from 16 to 512 (models.target.max_context), got 3"),
    ("max_len_negative", "tiny_bundle", _set(("defaults", "max_len"), -1),
     "manifest.json: defaults.max_len must be an integer from 16 to 512 (models.target.max_context), got -1"),
    ("max_len_text", "tiny_bundle", _set(("defaults", "max_len"), "x"),
     "manifest.json: defaults.max_len must be an integer from 16 to 512 (models.target.max_context), got 'x'"),
    ("max_len_1e40", "tiny_bundle", _set(("defaults", "max_len"), 1e40),
     "manifest.json: defaults.max_len must be an integer from 16 to 512 (models.target.max_context), got 1e+40"),
    ("max_len_over_context", "tiny_bundle", _set(("defaults", "max_len"), 513),
     "manifest.json: defaults.max_len must be an integer from 16 to 512 (models.target.max_context), got 513"),
    ("max_context_over_rotary", "tiny_bundle", _target("max_context", 4096),
     "target/model.onnx: manifest models.target.max_context is 4096, the graph's rotary table covers 512 positions"),
    ("usable_vocab_10", "tiny_bundle", _set(("tokenizer", "usable_vocab"), 10),
     "manifest.json: tokenizer.usable_vocab is 10, the bundle's is 400 (tokenizer.json has 400 tokens, the models' "
     "logits have 512/512 rows)"),
    ("drafting_bogus", "tiny_bundle", _set(("drafting",), {"mode": "bogus", "k": -5}),
     f"manifest.json: drafting.mode 'bogus' is not one of {MODES} (the drafting modes)"),
    ("drafting_k_negative", "tiny_bundle", _set(("drafting",), {"mode": "auto", "k": -5}),
     f"manifest.json: drafting.k must be an integer from 1 to {K_LIMIT}, got -5"),
    ("drafting_k_1e40", "tiny_bundle", _set(("drafting",), {"k": 1e40}),
     f"manifest.json: drafting.k must be an integer from 1 to {K_LIMIT}, got 1e+40"),
    ("drafting_k_max_k", "tiny_bundle", _set(("drafting",), {"k": 1e308, "max_k": -1}),
     f"manifest.json: drafting.k must be an integer from 1 to {K_LIMIT}, got 1e+308"),
    ("drafting_k_over_max_k", "tiny_bundle", _set(("drafting",), {"k": 8, "max_k": 4}),
     "manifest.json: drafting.k is 8, more than .max_k 4"),
    ("drafting_agreement", "tiny_bundle", _set(("drafting", "draft_agreement"), "x"),
     "manifest.json: drafting.draft_agreement must be a number from 0 to 1 (a share of tokens), got 'x'"),
    ("drafting_agreement_over_1", "tiny_bundle", _set(("drafting", "draft_agreement"), 1.5),
     "manifest.json: drafting.draft_agreement must be a number from 0 to 1 (a share of tokens), got 1.5"),
    ("drafting_unknown", "tiny_bundle", _set(("drafting", "kk"), 4),
     "manifest.json: drafting.'kk' is not a known field (expected mode, k, max_k, draft_agreement, "
     "draft_cost_ratio, expected_speedup, draft_vocab)"),
    ("activation_dtype", "tiny_bundle", _target("activation_dtype", "float16"),
     "target/model.onnx: manifest models.target.activation_dtype is float16, the graph's activations are float32 "
     "(cos_cache)"),
    ("block_size", "tiny_int8_bundle", _target("block_size", 7),
     "target/model.onnx: manifest models.target.block_size is 7, the graph's MatMulNBits use 32"),
    ("block_size_null", "tiny_int8_bundle", _target("block_size", None),
     "target/model.onnx: manifest models.target.block_size is null, the graph's MatMulNBits use 32"),
    ("block_size_fp32", "tiny_bundle", _target("block_size", 32),
     "target/model.onnx: manifest models.target.block_size is 32, the graph has no quantized MatMul (MatMulNBits) "
     "to have one"),
    ("accuracy_level", "tiny_int8_bundle", _target("accuracy_level", 1),
     "target/model.onnx: manifest models.target.accuracy_level is 1, the graph's MatMulNBits use 4"),
    ("quant_int4_on_int8", "tiny_int8_bundle", _target("quant", "int4"),
     "target/model.onnx: manifest models.target.quant is int4, the graph has MatMulNBits of 8 bits"),
    ("quant_int8_on_fp32", "tiny_bundle", _target("quant", "int8"),
     "target/model.onnx: manifest models.target.quant is int8, the graph has no quantized MatMul (MatMulNBits)"),
    ("quant_mixed_on_fp32", "tiny_bundle", _target("quant", "mixed"),
     "target/model.onnx: manifest models.target.quant is mixed (4- and 8-bit blocks), the graph has no quantized "
     "MatMul (MatMulNBits)"),
    ("quant_fp16_on_fp32", "tiny_bundle", _target("quant", "fp16"),
     "target/model.onnx: manifest models.target.quant is fp16, the graph's MatMul weights are float32"),
    ("head_bits", "tiny_int4_bundle", _target("head_bits", 4),
     "target/model.onnx: manifest models.target.head_bits is 4, the graph's lm_head MatMulNBits is 8-bit"),
    ("target_vocab_map", "tiny_bundle", _target("vocab_map", "tokenizer.json"),
     "manifest.json: models.target.vocab_map is 'tokenizer.json', but only the draft model may have a pruned "
     "vocabulary (the target scores every token)"),
    ("draft_vocab_map_tokenizer", "tiny_bundle", _set(("models", "draft", "vocab_map"), "tokenizer.json"),
     "manifest.json: models.draft.vocab_map 'tokenizer.json' is not a numpy array file (.npy): a vocabulary map is "
     "one integer id per logits row"),
    ("parity_nan", "tiny_bundle", _set(("models", "target", "parity", "top1"), float("nan")),
     "manifest.json: models.target.parity.top1 must be a number from 0 to 1, got nan"),
    ("parity_kl_inf", "tiny_bundle", _set(("models", "draft", "parity", "mean_kl"), float("inf")),
     "manifest.json: models.draft.parity.mean_kl must be a finite number >= 0, got inf"),
    ("eos_100000", "tiny_bundle", _set(("tokenizer", "eos_ids"), [2] * 100_000),
     "manifest.json: tokenizer.eos_ids has 100,000 ids, more than the 256 this edgespec reads"),
    ("special_tokens_past_vocab", "tiny_bundle", _set(("tokenizer", "special_tokens", "<x>"), 512),
     "manifest.json: tokenizer.special_tokens holds token id 512, outside the vocabulary [0, 512)"),
    ("self_draft_repeats", "tiny_bundle", _target("self_draft", {"skip": [1, 1]}),
     "manifest.json: models.target.self_draft.skip names a layer twice, got [1, 1]"),
]


@pytest.fixture
def lying(request, bundle_copy):
    def make(name):
        _, fixture, edit, line = next(c for c in LIES if c[0] == name)
        b = bundle_copy(request.getfixturevalue(fixture), name)
        rewrite_manifest(b, edit)
        return b, line
    return make


@pytest.mark.parametrize("name", [c[0] for c in LIES])
def test_each_lie_is_one_line_from_verify_the_loader_and_serve(lying, name, capsys):
    b, line = lying(name)
    assert read_bundle(b).problems == [line]
    with pytest.raises(BundleCorrupt) as e:
        Bundle.open(b, verify=False)
    assert e.value.problems == [line]
    assert main(["verify", str(b)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out == [f"{b}: {line}", f"{b}: NOT OK (1 problem(s))"]
    assert main(["serve", str(b), "--port", "0", "--no-warmup"]) == 78
    err = capsys.readouterr().err
    errors = [x for x in err.splitlines() if x.startswith("edgespec serve: error:")]
    assert len(errors) == 1 and "failed verification (1 problem(s))" in errors[0], err
    assert line in err


def _write_map(b, rel, ids):
    np.save(b / rel, np.asarray(ids))

    def edit(d):
        import hashlib

        data = (b / rel).read_bytes()
        d["files"][rel] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    rewrite_manifest(b, edit)


@pytest.mark.parametrize("ids, line", [
    (np.arange(199, dtype=np.int32), "holds 199 ids, the graph's logits have 200 rows"),
    (np.arange(200, dtype=np.float32), "must be 200 integer ids (one per logits row), the file holds float32 of shape "
                                       "(200,)"),
    (np.arange(200, 400, dtype=np.int32) + 1, "holds ids 201..400, outside the usable vocabulary [0, 400)"),
    (np.zeros(200, dtype=np.int32), "names a token id twice"),
])
def test_a_draft_vocab_map_is_read_against_the_graph(tiny_pruned_bundle, bundle_copy, ids, line):
    b = bundle_copy(tiny_pruned_bundle)
    _write_map(b, "draft/vocab_map.npy", ids)
    assert read_bundle(b).problems == [f"manifest.json: models.draft.vocab_map 'draft/vocab_map.npy' {line}"]


def test_a_map_that_is_not_numpy_is_one_line(tiny_pruned_bundle, bundle_copy):
    b = bundle_copy(tiny_pruned_bundle)
    (b / "draft" / "vocab_map.npy").write_bytes(b"{}")
    import hashlib

    rewrite_manifest(b, lambda d: d["files"]["draft/vocab_map.npy"].update(
        size=2, sha256=hashlib.sha256(b"{}").hexdigest()))
    assert read_bundle(b).problems == [
        "manifest.json: models.draft.vocab_map 'draft/vocab_map.npy' is not a numpy array file (ValueError)"]


def test_the_drafting_table_names_are_the_limits_names():
    from edgespec.drafters.modes import NAMES

    assert NAMES == DRAFT_MODES
