"""Every bad source is refused early, with its own clear message, before anything heavy runs."""
from __future__ import annotations

import http.server
import json
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the exporter needs the export extra")

from edgespec.errors import ExportError  # noqa: E402
from edgespec_export import sources  # noqa: E402
from edgespec_export.pipeline import ExportOptions, run_export  # noqa: E402
from edgespec_export.native.tiny_gguf import make_bad_gguf  # noqa: E402
from edgespec_export.tiny import make_tiny_gguf, make_tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def tiny_src(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("src") / "qwen", arch="qwen2")


def test_missing_local_path_is_named(tmp_path):
    with pytest.raises(ExportError, match=r"target source .*nope.* does not exist"):
        sources.resolve(str(tmp_path / "nope"), "target")
    with pytest.raises(ExportError, match=r"draft source ./missing\.gguf does not exist"):
        sources.resolve("./missing.gguf", "draft")


def test_folder_without_config(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ExportError, match="no config.json"):
        sources.resolve(str(tmp_path / "empty"))


def test_unreadable_config(tmp_path, tiny_src):
    bad = tmp_path / "bad"
    shutil.copytree(tiny_src, bad)
    (bad / "config.json").write_text("{not json")
    with pytest.raises(ExportError, match="config .* is not valid JSON"):
        sources.resolve(str(bad))


def test_unsupported_architecture_is_named_with_the_supported_list(tmp_path, tiny_src):
    bad = tmp_path / "gpt2"
    shutil.copytree(tiny_src, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg.update(model_type="gpt2", architectures=["GPT2LMHeadModel"])
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(sources.UnsupportedArchitecture) as e:
        sources.resolve(str(bad))
    msg = str(e.value)
    assert "'gpt2' (GPT2LMHeadModel)" in msg and "llama, mistral, qwen2, qwen3" in msg


def test_folder_without_weights_or_tokenizer(tmp_path, tiny_src):
    no_w = tmp_path / "no-weights"
    shutil.copytree(tiny_src, no_w)
    for f in no_w.glob("*.safetensors"):
        f.unlink()
    with pytest.raises(ExportError, match="no weights"):
        sources.resolve(str(no_w))
    no_t = tmp_path / "no-tok"
    shutil.copytree(tiny_src, no_t)
    (no_t / "tokenizer.json").unlink()
    with pytest.raises(ExportError, match="no tokenizer.json"):
        sources.resolve(str(no_t))


def test_prequantized_checkpoint_is_refused(tmp_path, tiny_src):
    q = tmp_path / "awq"
    shutil.copytree(tiny_src, q)
    cfg = json.loads((q / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "awq"}
    (q / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ExportError, match=r"pre-quantized \(awq\)"):
        sources.resolve(str(q))


def test_file_that_is_not_gguf(tmp_path):
    f = tmp_path / "model.gguf"
    f.write_bytes(b"PK\x03\x04 not a gguf at all")
    with pytest.raises(ExportError, match="not a GGUF file"):
        sources.resolve(str(f))
    other = tmp_path / "weights.bin"
    other.write_bytes(b"\x00" * 10)
    with pytest.raises(ExportError, match="neither a .gguf model nor"):
        sources.resolve(str(other))


def test_truncated_gguf_is_unreadable(tmp_path, tiny_src):
    good = make_tiny_gguf(tiny_src, tmp_path / "good.gguf")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(good.read_bytes()[:3000])
    with pytest.raises(ExportError, match="cannot read the GGUF file"):
        sources.resolve(str(cut))


def test_gguf_of_an_unsupported_architecture(tmp_path):
    f = make_bad_gguf(tmp_path / "bert.gguf", arch="bert")
    with pytest.raises(sources.UnsupportedArchitecture, match="GGUF architecture 'bert' is not supported"):
        sources.resolve(str(f))


def test_gguf_tensor_type_that_cannot_be_loaded(tmp_path):
    f = make_bad_gguf(tmp_path / "q8k.gguf", arch="llama", tensor_type="Q8_K")
    with pytest.raises(ExportError, match=r"tensor 'token_embd.weight' has GGUF type Q8_K, which cannot be loaded"):
        sources.resolve(str(f))


def test_gguf_resolves_with_facts(tmp_path, tiny_src):
    src = sources.resolve(str(make_tiny_gguf(tiny_src, tmp_path / "t.gguf")), "draft")
    assert (src.kind, src.arch, src.role) == ("gguf", "qwen2", "draft")
    assert src.vocab_rows == 512 and src.max_context == 512
    assert src.params > 100_000


def test_not_a_path_nor_a_hub_id(tmp_path):
    with pytest.raises(ExportError, match="is not a hub id"):
        sources.resolve("just-a-name")


# --- the hub, with no network ------------------------------------------------------------------
def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture
def empty_hub_cache(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    return tmp_path / "hub-cache"


def test_hub_id_fails_fast_when_the_hub_is_unreachable(monkeypatch, empty_hub_cache):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    t0 = time.monotonic()
    with pytest.raises(ExportError) as e:
        sources.resolve("Qwen/Qwen2.5-Coder-1.5B-Instruct", "target")
    assert time.monotonic() - t0 < 5
    msg = str(e.value)
    assert "hub cannot be reached" in msg and "--target DIR" in msg and ".gguf" in msg


def test_hub_that_accepts_but_never_answers_times_out(monkeypatch, empty_hub_cache):
    """A connection that hangs (a proxy black hole) must not hang the export."""
    from huggingface_hub import constants

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(5)  # the kernel accepts connections; nobody ever answers
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{srv.getsockname()[1]}")
    monkeypatch.setenv("EDGESPEC_HUB_TIMEOUT", "1")
    t0 = time.monotonic()
    try:
        with pytest.raises(ExportError, match="hub cannot be reached"):
            sources.resolve("Qwen/Qwen2.5-Coder-0.5B-Instruct", "draft")
    finally:
        srv.close()
    assert time.monotonic() - t0 < 4


def test_hub_offline_env_says_so(monkeypatch, empty_hub_cache):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ExportError, match="HF_HUB_OFFLINE is set"):
        sources.resolve("Qwen/Qwen2.5-Coder-1.5B-Instruct")


def test_hub_id_found_in_the_local_cache_needs_no_network(monkeypatch, empty_hub_cache, tiny_src):
    """A model already in the Hugging Face cache (downloaded earlier) is used offline."""
    from huggingface_hub import constants

    snap = empty_hub_cache / "models--acme--tiny" / "snapshots" / ("0" * 40)
    shutil.copytree(tiny_src, snap)
    (empty_hub_cache / "models--acme--tiny" / "refs").mkdir()
    (empty_hub_cache / "models--acme--tiny" / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    src = sources.resolve("acme/tiny", "target")
    assert src.kind == "hub" and src.path == snap and src.label == "acme/tiny"


def test_probe_counts_any_http_answer_as_reachable():
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):  # noqa: N802
            self.send_response(401)
            self.end_headers()

        def log_message(self, *a):
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        assert sources.probe_hub(f"http://127.0.0.1:{srv.server_port}", "a/b", 2.0) is None
    finally:
        srv.shutdown()
    port = _closed_port()
    why = sources.probe_hub(f"http://127.0.0.1:{port}", "a/b", 2.0)
    assert why.startswith(f"http://127.0.0.1:{port}: ") and "refused" in why.lower()


# --- choices that are the user's to make --------------------------------------------------------
def test_output_folder_that_exists_is_refused_without_overwrite(tmp_path, tiny_src):
    out = tmp_path / "bundle"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(ExportError, match="already exists: pass --overwrite"):
        run_export(str(tiny_src), out, options=ExportOptions(quant="fp32", isolate=False))
    assert (out / "keep.txt").read_text() == "mine"


def test_overwrite_replaces_only_a_bundle(tmp_path, tiny_src):
    """`-o ~/Documents --overwrite` must not delete someone's documents."""
    out = tmp_path / "docs"
    out.mkdir()
    (out / "thesis.txt").write_text("precious")
    with pytest.raises(ExportError, match="is not an edgespec bundle .*refusing to replace it"):
        run_export(str(tiny_src), out, options=ExportOptions(quant="fp32", isolate=False, overwrite=True))
    assert (out / "thesis.txt").read_text() == "precious"
    bundle = tmp_path / "bundle"
    run_export(str(tiny_src), bundle, options=ExportOptions(quant="fp32", isolate=False, parity_tokens=0))
    s = run_export(str(tiny_src), bundle, options=ExportOptions(quant="int4", isolate=False, overwrite=True, min_top1=0.3))
    assert s.manifest.models["target"].quant == "int4" and sorted(p.name for p in tmp_path.iterdir()) == ["bundle", "docs"]


def test_output_inside_the_source_is_refused(tmp_path, tiny_src):
    src = tmp_path / "src"
    shutil.copytree(tiny_src, src)
    with pytest.raises(ExportError, match="inside the target source folder"):
        run_export(str(src), src / "bundle", options=ExportOptions(quant="fp32", isolate=False))


def test_draft_larger_than_target_warns(tmp_path):
    small = make_tiny_model(tmp_path / "small", hidden=32, heads=2, kv_heads=1)
    big = make_tiny_model(tmp_path / "big", hidden=64)
    notes = []

    class Capture:
        from contextlib import nullcontext

        def stage(self, name, total, unit="it"):
            return self.nullcontext(type("S", (), {"update": lambda self, n=1: None})())

        def note(self, m):
            notes.append(m)

    s = run_export(str(small), tmp_path / "b", draft=str(big), options=ExportOptions(quant="fp32", isolate=False),
                   progress=Capture())
    assert any("larger than the target" in n for n in notes)
    assert any("larger than the target" in w for w in s.manifest.extra["warnings"])


@pytest.mark.parametrize("kw, msg", [
    (dict(quant="int3"), "--quant 'int3' is not one of"),
    (dict(block_size=24), "--block-size 24: must be a power of two"),
    (dict(accuracy_level=7), "--accuracy-level 7"),
    (dict(min_top1=1.5), "--min-top1 1.5"),
])
def test_bad_options_are_refused(tmp_path, tiny_src, kw, msg):
    with pytest.raises(ExportError, match=msg):
        run_export(str(tiny_src), tmp_path / "b", options=ExportOptions(isolate=False, **kw))
