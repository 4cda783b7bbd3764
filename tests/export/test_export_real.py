"""Real trained models through the real export path (slow; CI runs the SmolLM2 one).

The Qwen2.5-Coder pair takes ~10 minutes and ~9 GB: it runs only with EDGESPEC_TEST_QWEN_EXPORT=1
(it is what the README's numbers come from)."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch", reason="the exporter needs the export extra")

from edgespec.models.bundle import Bundle  # noqa: E402
from edgespec.engine.build import load_runner  # noqa: E402
from helpers.cli import export_cli  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.realmodel]


def greedy(bundle: Bundle, role: str, prompt_ids: list[int], n: int) -> list[int]:
    facts = bundle.manifest.models[role]
    r = load_runner(bundle.model_path(role), facts, len(prompt_ids) + n + 1)
    usable = bundle.manifest.tokenizer.usable_vocab
    out, logits = [], r.step(prompt_ids, 1)
    for _ in range(n):
        t = int(np.argmax(logits[0, :usable]))
        out.append(t)
        if t in bundle.manifest.tokenizer.eos_ids:
            break
        logits = r.step([t], 1)
    return out


def chat_ids(bundle: Bundle, text: str) -> list[int]:
    import jinja2

    tmpl = jinja2.Template(bundle.manifest.tokenizer.chat_template)
    prompt = tmpl.render(messages=[{"role": "user", "content": text}], add_generation_prompt=True)
    return bundle.load_tokenizer().encode(prompt, add_special_tokens=False).ids


def test_smollm2_gguf_exports_and_answers(smollm2_export):
    out, d = smollm2_export  # `edgespec export GGUF --quant int8 --min-top1 0.9` (tests/conftest.py)
    p = d["models"]["target"]["parity"]
    # the threshold asked for, 256 tokens (the native default), and the GGUF's blocks re-rounded to int8
    # close to the GGUF (measured 2026-12-04: top-1 0.969, top-5 1.0, mean KL 0.0033)
    assert p["min_top1"] == 0.9 and p["passed"] and p["tokens"] == 256, p
    assert p["top1"] >= 0.95 and p["top1_in_top5"] >= 0.99 and p["mean_kl"] < 0.01, p
    b = Bundle.open(out)
    t = b.manifest.tokenizer
    assert t.usable_vocab == 49152 and t.add_bos is False
    tok = b.load_tokenizer()
    assert [tok.id_to_token(i) for i in t.eos_ids][0] == "<|im_end|>"
    # the GGUF's own answer, up to the near-tie in the function's name: the GGUF (and the graph at
    # --accuracy-level 1, test_smollm2_native_export_is_the_gguf) says add_two_numbers, the default accuracy
    # level 4 (int8 activations) add_numbers; on "What is the capital of France?" the top two differ by 0.09
    answer = tok.decode(greedy(b, "target", chat_ids(b, "Write a Python function that adds two numbers."), 24))
    assert answer.startswith("```python\ndef add_") and "(num1, num2):\n    return num1 + num2" in answer
    # the memory plan on a real bundle, in CI: never under the measured peak RSS, at most 15 % over
    # (a fresh process, cache filled to max_len 2048 with tokens from the whole vocabulary)
    from edgespec.edge import memcheck, memory
    from edgespec.engine.measure import measure_fresh

    plan = memory.plan(b, max_len=2048, want_draft=False, budget_bytes=None)
    rss = measure_fresh(out, max_len=plan.max_len, load_draft=False)
    check = memcheck.compare(plan, rss["peak"])
    print(check.describe())
    assert -0.15 <= check.error <= 0.0, check.describe()


def test_smollm2_native_export_is_the_gguf(tmp_path, real_gguf):
    """The native exporter carries SmolLM2's Q4_1/Q8_0 blocks over: at --accuracy-level 1 (float
    activations) the graph is the GGUF's own forward pass: parity top-1 >= 0.99 against it, `verify`
    accepts the bundle, and its greedy answer is the GGUF's (numpy forward, greedy)."""
    from edgespec.cli.commands import verify as verify_cmd
    from edgespec_export.native.gguf_model import GGUFModel
    from edgespec_export.native.reference import forward_hidden

    gguf = real_gguf("smollm2-135m-instruct")
    out = tmp_path / "smollm2-native"
    d = export_cli(str(gguf), "-o", str(out), "--accuracy-level", "1")
    p = d["models"]["target"]["parity"]
    # float activations over the GGUF's own blocks: the numpy forward itself (measured: top-1 1.0, KL 0.0);
    # at most one of 256 tokens may flip at a float32 near-tie on another CPU
    assert p["reference"] == "gguf dequantized, numpy float32" and p["top1"] >= 255 / 256, p
    assert p["mean_kl"] < 1e-4 and p["max_kl"] < 0.01, p
    manifest, problems = verify_cmd.check(out, load=True)
    assert problems == [] and manifest.extra["exporters"] == {"target": "native"}
    b = Bundle.open(out)
    ids = chat_ids(b, "Write a Python function that adds two numbers.")
    got = greedy(b, "target", ids, 16)
    gg = GGUFModel(gguf)
    head, usable, ref = gg.floats("token_embd.weight"), b.manifest.tokenizer.usable_vocab, list(ids)
    for _ in range(len(got)):
        ref.append(int(np.argmax(head[:usable] @ forward_hidden(gg, ref)[-1])))
    assert got == ref[len(ids):]


def test_smollm2_cuda_flavor_int8(tmp_path, real_gguf):
    """`--ep cuda --quant int8`: float16 activations/attention/KV, run here by the CPU provider."""
    from edgespec.cli.commands import verify as verify_cmd
    from edgespec.engine import Engine

    gguf = real_gguf("smollm2-135m-instruct")
    out = tmp_path / "smollm2-cuda"
    d = export_cli(str(gguf), "-o", str(out), "--quant", "int8", "--ep", "cuda", "--min-top1", "0.9")
    g = d["models"]["target"]["graphs"]
    assert list(g) == ["cuda"] and g["cuda"]["kv_dtype"] == "float16" and g["cuda"]["activation_dtype"] == "float16"
    p = g["cuda"]["parity"]
    print(f"smollm2 int8 cuda flavor parity: top-1 {p['top1']:.1%}, mean KL {p['mean_kl']:.4f}")
    assert p["passed"] and p["top1"] >= 0.9
    manifest, problems = verify_cmd.check(out, load=True)
    assert problems == []
    b = Bundle.open(out)
    # the memory plan of a float16 KV cache on the CPU provider: never under the measured peak RSS,
    # at most 15 % over (measured 2026-12-01: 5.8 % over at max_len 2048)
    from edgespec.edge import memcheck, memory
    from edgespec.engine.measure import measure_fresh

    plan = memory.plan(b, max_len=2048, want_draft=False, budget_bytes=None)
    check = memcheck.compare(plan, measure_fresh(out, max_len=plan.max_len, load_draft=False)["peak"])
    print(check.describe())
    assert -0.15 <= check.error <= 0.0, check.describe()
    r = load_runner(b.model_path("target"), b.target, 64, providers="cpu")
    assert all(ov.data_type() == "tensor(float16)" for ov in r.runner.kv)
    ptr = r.runner.kv[0].data_ptr()
    r.step([1, 2, 3], 1)
    assert r.runner.kv[0].data_ptr() == ptr  # present written into the past buffer: bound in place
    # speculative greedy (ngram: no draft model) against target-alone. float16 kernels round a k-token
    # verify differently from a 1-token step, so a near-tie of the top two logits can flip: measured
    # here 37 of 48 runs identical (12 prompts x ngram k 2/4/8 + auto), the rest diverging at a
    # position whose top two logits were 0.09-0.19 apart. So: identical up to the first difference,
    # and that difference is a near-tie (a real bug would diverge where the target is sure).
    eng = Engine.open(out, providers="cpu", max_len=512)
    usable = b.manifest.tokenizer.usable_vocab
    same = 0
    prompts = ["Write a Python function that adds two numbers.", "List three colors.", "def fibonacci(n):",
               "Name two planets."]
    for text in prompts:
        ref = eng.generate(text, max_new_tokens=48, draft="none")
        got = eng.generate(text, max_new_tokens=48, draft="ngram", k=4)
        if got.token_ids == ref.token_ids:
            same += 1
            continue
        # where they part; one may be the other's start (it ended there: its end-of-text was the flipped token)
        i = next((j for j, (a, c) in enumerate(zip(got.token_ids, ref.token_ids)) if a != c),
                 min(len(got.token_ids), len(ref.token_ids)))
        eng.target.reset()
        row = np.sort(np.asarray(eng.target.step(eng.encode(text) + ref.token_ids[:i], 1)[-1][:usable], dtype=np.float64))
        eng.reset_cache()  # the slot was stepped by hand
        # a near-tie: 0.09-0.19 apart on an Intel Xeon (AVX-512), 0.34 on an AMD EPYC (AVX2), where float16
        # is rounded in other kernels; a bug parts where the target is sure (logits several apart)
        assert row[-1] - row[-2] < 0.5, (text, i, row[-1] - row[-2])
    print(f"speculative == target-alone on {same}/{len(prompts)} prompts; the others diverge at a near-tie")
    assert same >= 1
