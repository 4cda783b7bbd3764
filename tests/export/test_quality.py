"""`python -m edgespec_export.quality`: KL divergence and perplexity against the GGUF's own numpy
forward pass over a fixed text, chunk by chunk (llama.cpp's way), on tiny generated GGUFs."""
from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("gguf", reason="the reference reads GGUF files with the gguf package")

from edgespec_export.native.tiny_gguf import Q4_K_M, make_gguf  # noqa: E402
from edgespec_export.parity import log_softmax  # noqa: E402
from edgespec_export.pipeline import ExportOptions, run_export  # noqa: E402
from edgespec_export.quality import Tally, main, measure, quality_text  # noqa: E402


def test_tally_is_kl_top1_and_perplexity():
    ref = log_softmax(np.array([[2.0, 0.0, -1.0], [0.0, 1.0, 0.0]], np.float32))
    got = log_softmax(np.array([[1.0, 0.0, -1.0], [0.0, 1.0, 0.5]], np.float32))
    nxt = np.array([0, 2])
    t = Tally()
    t.add(ref, got, nxt)
    s = t.summary(ref_nll=float(-ref[0, 0] - ref[1, 2]))
    kl = (np.exp(ref) * (ref - got)).sum(axis=1)
    assert s["positions"] == 2 and s["same_top1"] == 1.0 and s["mean_kld"] == pytest.approx(kl.mean(), abs=1e-6)
    assert s["ppl"] == pytest.approx(math.exp(-(got[0, 0] + got[1, 2]) / 2), rel=1e-4)
    assert s["ppl_reference"] == pytest.approx(math.exp(-(ref[0, 0] + ref[1, 2]) / 2), rel=1e-4)


def test_the_text_is_long_enough_for_8k_tokens():
    text = quality_text()
    assert text.startswith("                    GNU GENERAL PUBLIC LICENSE") and "Apache License" in text
    assert len(text) > 40_000  # ~9,700 Qwen2.5 tokens (measured with its tokenizer)


def test_kept_form_measures_zero_and_the_rounded_one_what_it_costs(tmp_path, capsys):
    """Every GGUF number kept (accuracy level 1): KL 0 and the reference's perplexity; Q6_K rounded to
    8 bits in blocks of 128 (the default) on the tiny random model: the KL measured (mean 0.0023, same
    top-1 0.978 over 45 positions)."""
    from edgespec.models.bundle import Bundle

    path = make_gguf(tmp_path / "m.gguf", arch="qwen2", types=Q4_K_M, tied=False, seed=4)
    kept = run_export(str(path), tmp_path / "kept", options=ExportOptions(
        accuracy_level=1, isolate=False, parity_tokens=0, force=True, gguf_q6k_block=0)).path
    rounded = run_export(str(path), tmp_path / "rounded", options=ExportOptions(
        accuracy_level=1, isolate=False, parity_tokens=0, force=True)).path
    b = Bundle.open(kept)
    facts = b.manifest.models["target"]
    usable = b.manifest.tokenizer.usable_vocab
    ids = [i % usable for i in range(7, 7 + 7 * 100, 7)]  # 100 tokens: 3 chunks of 32, 4 left out
    graphs = {"kept": (b.model_path("target"), facts), "rounded": (rounded / facts.path, facts)}
    res = measure(path, graphs, ids, usable, chunk=32)
    k, r = res["kept"], res["rounded"]
    assert k["positions"] == r["positions"] == 3 * 15
    assert k["mean_kld"] < 1e-6 and k["same_top1"] == 1.0 and k["ppl"] == pytest.approx(k["ppl_reference"], rel=1e-4)
    assert r["mean_kld"] == pytest.approx(0.00234, abs=5e-4) and r["same_top1"] >= 0.95, r
    with pytest.raises(ValueError, match="100 tokens make no chunk of 128"):
        measure(path, graphs, ids, usable, chunk=128)
    assert main([str(path), str(kept), "--graph", f"rounded={rounded / facts.path}", "--tokens", "64",
                 "--chunk", "32"]) == 0
    out = capsys.readouterr().out
    assert '"form": "bundle"' in out and "| rounded |" in out
