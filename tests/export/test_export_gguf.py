"""GGUF sources: tiny models written the way llama.cpp lays them out go through the real export path."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the exporter needs the export extra")

from transformers import AutoModelForCausalLM  # noqa: E402

from edgespec.models.bundle import Bundle  # noqa: E402
from edgespec_export.pipeline import ExportOptions, run_export  # noqa: E402
from edgespec_export.sources import load_model, resolve  # noqa: E402
from edgespec_export.tiny import make_tiny_gguf, make_tiny_model  # noqa: E402


@pytest.mark.parametrize("arch, tied", [("qwen2", False), ("llama", True), ("llama", False), ("qwen3", False)])
def test_f32_gguf_loads_to_exactly_the_original_weights(tmp_path, arch, tied):
    """Tensor names, llama's permuted Q/K rows and tied embeddings all come back as they were."""
    hf = make_tiny_model(tmp_path / "hf", arch=arch, tied=tied)
    gguf = make_tiny_gguf(hf, tmp_path / "m.gguf", qtype="F32")
    src = resolve(str(gguf))
    loaded = load_model(src)
    orig = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32)
    a, b = orig.state_dict(), loaded.state_dict()
    assert set(a) == set(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert src.config["tie_word_embeddings"] is tied
    assert loaded.config.architectures == [type(orig).__name__]


def test_q8_gguf_export_with_an_hf_draft(tmp_path):
    """A Q8_0 GGUF target and a Hugging Face draft of the same family share one tokenizer once the
    GGUF's padding tokens are dropped; parity is measured against the GGUF's own (dequantized) weights."""
    hf = make_tiny_model(tmp_path / "hf", arch="qwen2")
    gguf = make_tiny_gguf(hf, tmp_path / "m.gguf", qtype="Q8_0")
    s = run_export(str(gguf), tmp_path / "b", draft=str(hf), options=ExportOptions(quant="fp32", isolate=False))
    m = s.manifest
    assert m.tokenizer.usable_vocab == 400
    assert m.models["target"].source == "m.gguf" and m.extra["sources"]["target"]["kind"] == "gguf"
    assert m.models["target"].parity["top1"] >= 0.99
    # Q8_0 barely moves the predictions: the draft (the unquantized original) agrees almost always
    assert m.drafting["draft_agreement"] >= 0.9
    b = Bundle.open(s.path)
    tok = b.load_tokenizer()
    assert tok.encode("<|im_start|>user\nhi<|im_end|>").ids[0] == 1  # special tokens whole, no BOS added


def test_f16_gguf_and_smollm_tokenizer(tmp_path):
    hf = make_tiny_model(tmp_path / "hf", arch="llama", tied=True)
    gguf = make_tiny_gguf(hf, tmp_path / "s.gguf", qtype="F16", pre="smollm")
    s = run_export(str(gguf), tmp_path / "b", options=ExportOptions(quant="fp32", isolate=False))
    assert s.manifest.models["target"].parity["top1"] >= 0.99
    tok = Bundle.open(s.path).load_tokenizer()
    assert len(tok.encode("2024").ids) == 4  # digits one by one, as llama.cpp's smollm pre-tokenizer does
    notes = s.manifest.extra["tokenizer_notes"]["target"]
    assert any("digits" in n for n in notes)
    np.testing.assert_array_equal(tok.encode("hello").ids, tok.encode("hello").ids)


def test_via_torch_still_exports_a_gguf_and_agrees_with_native(tmp_path):
    """`--via torch` dequantizes the GGUF into transformers for the builder (the path before the native
    exporter); on an F32 GGUF both exporters give graphs that predict the same tokens."""
    hf = make_tiny_model(tmp_path / "hf", arch="llama")
    gguf = make_tiny_gguf(hf, tmp_path / "m.gguf", qtype="F32")
    torch_b = run_export(str(gguf), tmp_path / "t", options=ExportOptions(quant="fp32", isolate=False, via="torch"))
    native_b = run_export(str(gguf), tmp_path / "n", options=ExportOptions(quant="fp32", isolate=False))
    assert torch_b.manifest.extra["exporters"] == {"target": "torch"}
    assert native_b.manifest.extra["exporters"] == {"target": "native"}
    # each graph is the float model its own reference computes (measured: top-1 1.0, KL 0.0 for both)
    for b, reference in ((torch_b, "transformers float32"), (native_b, "gguf dequantized, numpy float32")):
        p = b.manifest.models["target"].parity
        assert p["reference"] == reference and p["top1"] >= 0.99 and p["mean_kl"] < 1e-5 and p["max_kl"] < 1e-3, p
    from edgespec.engine.engine import Engine  # the same tokens from both graphs, greedy
    said = []
    for b in (torch_b.path, native_b.path):
        e = Engine.open(b, draft="none", max_len=64, warmup=False, verify=False)
        said.append(e.generate("hello world", max_new_tokens=12).token_ids)
        e.close()
    assert said[0] == said[1] and len(said[0]) == 12, said
