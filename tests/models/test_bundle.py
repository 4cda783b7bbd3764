"""Bundle.open: the runtime's loader trusts nothing it has not checked."""
from __future__ import annotations

import json

import pytest

from edgespec.models.bundle import Bundle, compatibility_problems
from edgespec.errors import BundleCorrupt
from edgespec.models.bundlecheck import verify_bundle
from edgespec.models.manifest import Manifest, content_digest
from helpers.manifests import rewrite_manifest


def test_facts_and_paths(tiny_bundle):
    b = Bundle.open(tiny_bundle)
    assert b.target.arch == "qwen2" and b.draft is not None
    assert b.model_path("target") == tiny_bundle / "target" / "model.onnx"
    on_disk = sum(f.stat().st_size for f in (tiny_bundle / "target").iterdir())
    assert b.model_bytes("target") == on_disk
    assert b.manifest.tokenizer.usable_vocab == 400 < b.target.vocab_size == 512
    assert b.manifest.defaults["max_len"] == 512
    assert b.load_tokenizer().get_vocab_size() == 400


def test_manifest_round_trips_and_its_digest_covers_every_field(tiny_bundle):
    d = json.loads((tiny_bundle / "manifest.json").read_text())
    m = Manifest.from_dict(d)
    assert m.compute_digest() == d["digest"] == content_digest(d)
    for key in ("name", "drafting", "defaults", "created_at"):
        changed = dict(d, **{key: "x"})
        assert content_digest(changed) != d["digest"], key


def test_draft_that_cannot_score_the_usable_vocabulary(tiny_bundle, bundle_copy):
    b = bundle_copy(tiny_bundle)
    rewrite_manifest(b, lambda d: d["models"]["draft"].update(vocab_size=300))
    # the files and digest are fine, but the graph's logits say 512 (tests/models/test_manifest_lies.py) ...
    assert verify_bundle(b)[1] == ["draft/model.onnx: manifest models.draft.vocab_size is 300, the graph's logits have 512 rows"]
    with pytest.raises(BundleCorrupt, match="vocab_size is 300"):
        Bundle.open(b)
    # ... and the combination itself is refused too (a graph whose logits width is symbolic)
    m = Manifest.from_dict(json.loads((b / "manifest.json").read_text()))
    assert compatibility_problems(m) == ["draft model scores 300 tokens but the tokenizer has 400: the bundle was "
                                         "built from mismatched models"]


def test_unknown_fields_are_named(tiny_bundle, bundle_copy):
    b = bundle_copy(tiny_bundle)
    rewrite_manifest(b, lambda d: d["models"]["target"].update(rope="yes"))
    with pytest.raises(BundleCorrupt, match="models.target.rope is not a known field"):
        Bundle.open(b)
    rewrite_manifest(b, lambda d: (d["models"]["target"].pop("rope"), d.update(signature="abc")))
    with pytest.raises(BundleCorrupt, match="'signature' is not a known field"):
        Bundle.open(b)


def test_paths_may_not_leave_the_bundle(tiny_bundle, bundle_copy):
    b = bundle_copy(tiny_bundle)
    rewrite_manifest(b, lambda d: d["files"].update({"../etc/passwd": {"sha256": "0" * 64, "size": 1}}))
    with pytest.raises(BundleCorrupt, match="leaves the bundle folder"):
        Bundle.open(b)


def test_open_accepts_the_manifest_path(tiny_bundle):
    assert Bundle.open(tiny_bundle / "manifest.json").root == tiny_bundle
