"""`edgespec export` as a user runs it: a separate process, one child per model, a summary, exit codes."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the exporter needs the export extra")

from edgespec.models.bundlecheck import verify_bundle  # noqa: E402
from edgespec_export.tiny import make_tiny_draft, make_tiny_model  # noqa: E402


def edgespec(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgespec", *args], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("cli")
    target = make_tiny_model(root / "target")
    return target, make_tiny_draft(target, root / "draft", noise=0.05)


@pytest.mark.slow
def test_export_pair_in_child_processes(tmp_path, pair):
    target, draft = pair
    out = tmp_path / "bundle"
    r = edgespec("export", "--target", str(target), "--draft-model", str(draft), "-o", str(out), "--quant", "int4",
                 "--min-top1", "0.5", "--max-context", "256", "--name", "tiny-pair", "--self-draft")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"bundle {out}") and "verified" in lines[0]
    assert any(l.strip().startswith("target qwen2") and "parity top-1" in l for l in lines)
    assert any(l.strip().startswith("draft") for l in lines)
    assert "peak memory" in r.stdout
    # bars went to stderr, named by step
    for step in ("load target", "build target", "quantize target (int4)", "save draft", "parity draft (exported)"):
        assert step in r.stderr
    # every bar with a knowable total shows it: the 2-layer target's self-draft search measures 1 set
    assert re.search(r"self-draft search .*\b1/1\b", r.stderr), r.stderr
    assert "warning: --draft SRC" not in r.stderr
    assert "Reading layer" not in r.stderr + r.stdout  # the builder's own chatter stays out
    manifest, problems = verify_bundle(out)
    assert problems == []
    assert manifest.name == "tiny-pair" and manifest.defaults == {"max_len": 256}
    ex = manifest.extra["exporter"]
    assert ex["onnxruntime-genai"] == "0.15.2" and ex["peak_rss_bytes"]["process_tree"] > 0 and ex["seconds"] > 0
    assert manifest.models["draft"].parity["tokens"] == manifest.models["target"].parity["tokens"] > 100


@pytest.mark.slow
def test_positional_target_and_json_summary(tmp_path, pair):
    target, _ = pair
    out = tmp_path / "b"
    r = edgespec("export", str(target), "--out", str(out), "--quant", "fp32", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["path"] == str(out) and d["models"]["target"]["parity"]["passed"] is True
    assert d["drafting"] == {"mode": "auto", "k": 4, "max_k": 8}
    assert r.stderr == ""  # --json: no bars


def test_user_errors_are_one_line_and_exit_1(tmp_path, pair):
    target, _ = pair
    r = edgespec("export", str(tmp_path / "missing"), "-o", str(tmp_path / "b"))
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [f"edgespec export: error: target source {tmp_path / 'missing'} does not exist"]
    (tmp_path / "b").mkdir()
    r = edgespec("export", str(target), "-o", str(tmp_path / "b"), "--quant", "fp32")
    assert r.returncode == 1 and "already exists: pass --overwrite" in r.stderr
    r = edgespec("export", "-o", str(tmp_path / "c"))
    assert r.returncode == 1 and "no target" in r.stderr


def test_missing_workstation_extra_is_one_clear_line(tmp_path, monkeypatch, capsys):
    """Without torch a Hugging Face folder (or --via torch) says what to install instead of a
    traceback; a .gguf file needs no torch and goes on (here: to its own "does not exist")."""
    import importlib.util

    from edgespec.cli.main import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    (tmp_path / "hf").mkdir()
    assert main(["export", str(tmp_path / "hf"), "-o", str(tmp_path / "b")]) == 1
    err = capsys.readouterr().err
    assert "needs the exporter's torch extra (torch missing)" in err and "pip install './export[torch]'" in err
    assert main(["export", str(tmp_path / "m.gguf"), "-o", str(tmp_path / "b"), "--via", "torch"]) == 1
    assert "torch extra (torch missing)" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "m.gguf"), "-o", str(tmp_path / "b")]) == 1
    err = capsys.readouterr().err
    assert "m.gguf does not exist" in err and "torch" not in err


def test_native_export_without_gguf_names_the_package(tmp_path, monkeypatch, capsys):
    import importlib.util

    from edgespec.cli.main import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    assert main(["export", str(tmp_path / "m.gguf"), "-o", str(tmp_path / "b")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["edgespec export: error: the exporter needs gguf: pip install ./export  (from the edgespec "
                   "source tree)"]


@pytest.mark.slow
def test_gguf_pair_through_the_cli(tmp_path, pair):
    """GGUF sources take the isolated tokenizer step too (converting a GGUF tokenizer is heavy)."""
    from edgespec_export.tiny import make_tiny_gguf

    target, draft = pair
    tg = make_tiny_gguf(target, tmp_path / "target.gguf")
    dg = make_tiny_gguf(draft, tmp_path / "draft.gguf")
    out = tmp_path / "b"
    r = edgespec("export", "--target", str(tg), "--draft", str(dg), "-o", str(out), "--quant", "fp32", "--json")
    assert r.returncode == 0, r.stderr
    assert "warning: --draft SRC is now --draft-model SRC" in r.stderr  # the old spelling still works
    d = json.loads(r.stdout)
    assert d["usable_vocab"] == 400 and d["models"]["draft"]["source"] == "draft.gguf"
    m, problems = verify_bundle(out)
    assert problems == [] and "dropped 112 padding tokens" in " ".join(m.extra["tokenizer_notes"]["target"])
    assert set(m.extra["peak_rss_bytes_by_model"]) == {"target", "draft"}


def test_runtime_without_the_export_half_names_the_install(monkeypatch, capsys):
    """A device install (`pip install .` at the root) has no `edgespec.commands` entry point for export:
    `edgespec export ...` is still a command, and it answers with the one line that installs the half."""
    import edgespec.cli.main as cli

    monkeypatch.setattr(cli, "entry_points", lambda group: [])
    assert cli.main(["export", "model.gguf", "-o", "out", "--quant", "int4"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["edgespec export: error: the export half of edgespec is not installed: " + cli.PLUGGED["export"]]
