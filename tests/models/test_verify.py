"""`edgespec verify` and Bundle.open catch every kind of damage, one clear line per problem."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from edgespec.cli.main import main
from edgespec.errors import BundleCorrupt, BundleNotFound
from edgespec.models.bundle import Bundle
from helpers.cli import verify


def test_a_fresh_bundle_verifies(tiny_bundle):
    rc, lines = verify(tiny_bundle)
    assert rc == 0 and len(lines) == 1
    assert "OK" in lines[0] and "sha256 checked" in lines[0] and "target qwen2 fp32 (cpu: float32 KV), draft qwen2 fp32 (cpu: float32 KV)" in lines[0]
    assert Bundle.open(tiny_bundle).name == "qwen-agree"


def test_load_option_runs_every_model(tiny_bundle):
    rc, lines = verify(tiny_bundle, "--load", "--fast")
    assert rc == 0 and "loaded and stepped" in lines[0]


def test_flipped_byte_in_weights(tiny_bundle, bundle_copy):
    b = bundle_copy(tiny_bundle)
    data = b / "draft" / "model.onnx.data"
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    data.write_bytes(bytes(raw))
    rc, lines = verify(b)
    assert rc == 1
    assert lines[0] == f"{b}: draft/model.onnx.data: sha256 " + lines[0].split("sha256 ")[1]
    assert "does not match the manifest's" in lines[0] and "NOT OK (1 problem(s))" in lines[-1]
    # --fast (sizes only) cannot see a flipped byte: that is what it trades away
    assert verify(b, "--fast")[0] == 0
    with pytest.raises(BundleCorrupt) as e:
        Bundle.open(b)
    assert e.value.problems == [lines[0].split(": ", 1)[1]]


def test_missing_file(tiny_bundle, bundle_copy):
    b = bundle_copy(tiny_bundle)
    (b / "target" / "model.onnx.data").unlink()
    rc, lines = verify(b)
    assert rc == 1 and f"{b}: target/model.onnx.data: missing" in lines
    with pytest.raises(BundleCorrupt, match="target/model.onnx.data: missing"):
        Bundle.open(b, verify=False)  # even without hashing


def test_truncated_file(tiny_bundle, bundle_copy):
    b = bundle_copy(tiny_bundle)
    f = b / "tokenizer.json"
    f.write_bytes(f.read_bytes()[:-10])
    rc, lines = verify(b, "--fast")
    assert rc == 1 and "tokenizer.json: size" in lines[0] and "manifest says" in lines[0]


def test_edited_manifest_value(tiny_bundle, bundle_copy):
    """Changing a fact (here the layer count) without touching any file is caught by the digest."""
    b = bundle_copy(tiny_bundle)
    m = json.loads((b / "manifest.json").read_text())
    m["models"]["target"]["layers"] = 3
    (b / "manifest.json").write_text(json.dumps(m, indent=2))
    rc, lines = verify(b, "--fast")
    assert rc == 1 and "manifest.json: edited after export" in lines[0]
    with pytest.raises(BundleCorrupt, match="edited after export"):
        Bundle.open(b)


def test_reformatted_manifest_still_verifies(tiny_bundle, bundle_copy):
    b = bundle_copy(tiny_bundle)
    m = json.loads((b / "manifest.json").read_text())
    (b / "manifest.json").write_text(json.dumps(m, indent=4, sort_keys=True))
    assert verify(b)[0] == 0


def test_edited_checksum_in_manifest(tiny_bundle, bundle_copy):
    b = bundle_copy(tiny_bundle)
    m = json.loads((b / "manifest.json").read_text())
    m["files"]["tokenizer.json"]["sha256"] = "0" * 64
    (b / "manifest.json").write_text(json.dumps(m, indent=2))
    rc, lines = verify(b)
    assert rc == 1
    assert any("edited after export" in l for l in lines) and any("tokenizer.json: sha256" in l for l in lines)


def test_extra_file(tiny_bundle, bundle_copy):
    b = bundle_copy(tiny_bundle)
    (b / "target" / "notes.txt").write_text("hello")
    rc, lines = verify(b)
    assert rc == 1 and lines[0] == f"{b}: target/notes.txt: present but not listed in the manifest"
    with pytest.raises(BundleCorrupt, match="notes.txt: present but not listed"):
        Bundle.open(b)


def test_manifest_that_is_not_json_or_missing(tiny_bundle, bundle_copy):
    b = bundle_copy(tiny_bundle)
    (b / "manifest.json").write_text('{"format": "edgespec-bundle", ')
    rc, lines = verify(b)
    assert rc == 1 and "manifest.json: unreadable JSON" in lines[0]
    (b / "manifest.json").unlink()
    rc, lines = verify(b)
    assert rc == 1 and "missing: not a bundle, or an unfinished export" in lines[0]


def test_newer_format_version_is_named(tiny_bundle, bundle_copy):
    b = bundle_copy(tiny_bundle)
    m = json.loads((b / "manifest.json").read_text())
    m["format_version"] = 99
    (b / "manifest.json").write_text(json.dumps(m))
    rc, lines = verify(b)
    assert rc == 1 and "format_version 99 is not supported" in lines[0]


def test_several_problems_one_line_each(tiny_bundle, bundle_copy):
    b = bundle_copy(tiny_bundle)
    (b / "draft" / "model.onnx").unlink()
    (b / "stray.bin").write_bytes(b"x")
    f = b / "tokenizer_config.json"
    f.write_text(f.read_text() + " ")
    rc, lines = verify(b)
    assert rc == 1 and len(lines) == 4 and lines[-1].endswith("NOT OK (3 problem(s))")


def test_json_output_and_missing_bundle(tmp_path, tiny_bundle):
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["verify", str(tiny_bundle), "--json", "--fast"])
    d = json.loads(out.getvalue())
    assert rc == 0 and d["ok"] and d["problems"] == [] and d["checksums"] is False
    rc, lines = verify(tmp_path / "nothing")
    assert rc == 1 and "does not exist" in lines[0]
    with pytest.raises(BundleNotFound):
        Bundle.open(tmp_path / "nothing")


def test_verify_cli_process_exit_codes(tiny_bundle, bundle_copy):
    """As a user runs it: a separate process, exit status 0 / 1."""
    good = subprocess.run([sys.executable, "-m", "edgespec", "verify", str(tiny_bundle)], capture_output=True, text=True)
    assert good.returncode == 0, good.stderr
    b = bundle_copy(tiny_bundle)
    (b / "target" / "model.onnx").write_bytes(b"garbage")
    bad = subprocess.run([sys.executable, "-m", "edgespec", "verify", str(b)], capture_output=True, text=True)
    assert bad.returncode == 1 and "target/model.onnx: size" in bad.stdout
