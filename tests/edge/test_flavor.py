"""Graph flavors: the manifest fields, verify's checks, and which graph the runner loads for the
provider it gets (the provider list faked: no GPU here), including the refusal of a cpu-flavored
graph on CUDA."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import onnxruntime as ort
import pytest

from edgespec.edge import flavor
from edgespec.engine import build as runner_mod
from edgespec.models.bundle import Bundle
from edgespec.cli.commands import verify as verify_cmd
from edgespec.engine import Engine
from edgespec.errors import ProviderError
from edgespec.models.manifest import MANIFEST_NAME, ModelFacts, check_schema, content_digest
from edgespec.edge.providers import CPU, CUDA, TRT


def facts(**kw) -> ModelFacts:
    base = dict(path="target/model.onnx", arch="qwen2", layers=2, kv_heads=2, head_dim=16, hidden_size=64,
                vocab_size=512, quant="int8", max_context=512)
    return ModelFacts(**{**base, **kw})


# --- manifest fields ----------------------------------------------------------------------------
def test_bundles_before_flavors_default_by_their_kv_dtype():
    assert facts().graph_flavor() == "cpu"  # float32 KV: the builder's cpu flavor
    assert facts(kv_dtype="float16").graph_flavor() == "cuda"  # old fp16 bundles: the builder's cuda flavor
    assert facts(flavor="cpu", kv_dtype="float16").graph_flavor() == "cpu"  # explicit wins


def test_graphs_expands_the_other_flavors():
    f = facts(flavor="cpu", flavors={"cuda": {"path": "target/model.cuda.onnx", "kv_dtype": "float16",
                                              "activation_dtype": "float16", "logits_dtype": "float32"}})
    g = f.graphs()
    assert list(g) == ["cpu", "cuda"] and g["cpu"] is f
    assert g["cuda"].path == "target/model.cuda.onnx" and g["cuda"].kv_dtype == "float16"
    assert g["cuda"].graph_flavor() == "cuda" and g["cuda"].flavors == {} and g["cuda"].layers == 2
    assert g["cuda"].kv_bytes_per_token() * 2 == f.kv_bytes_per_token()


def test_the_both_flavors_bundle_records_each_graph(tiny_both_flavors_bundle):
    m = Bundle.open(tiny_both_flavors_bundle).manifest
    for role in ("target", "draft"):
        g = m.models[role].graphs()
        assert g["cpu"].path == f"{role}/model.onnx" and g["cpu"].kv_dtype == "float32"
        assert g["cpu"].activation_dtype == "float32"
        assert g["cuda"].path == f"{role}/model.cuda.onnx" and g["cuda"].kv_dtype == "float16"
        assert g["cuda"].activation_dtype == "float16" and g["cuda"].logits_dtype == "float32"
        # parity is measured per flavor
        assert g["cpu"].parity["flavor"] == "cpu" and g["cuda"].parity["flavor"] == "cuda"
        assert g["cuda"].parity["top1"] >= 0.95


def _manifest(bundle) -> dict:
    return json.loads((bundle / MANIFEST_NAME).read_text())


@pytest.mark.parametrize("edit, words", [
    (lambda t: t.update(flavor="tpu"), "flavor 'tpu' is not one of cpu, cuda"),
    (lambda t: t["flavors"]["cuda"].update(path="target/nope.onnx"), "is not listed in 'files'"),
    (lambda t: t["flavors"].update(rocm={"path": "target/model.onnx"}), "'rocm' is not one of"),
    (lambda t: t["flavors"]["cuda"].update(layers=3), "is not a field a flavor may set"),
    (lambda t: t["flavors"].update(cpu={"path": "target/model.onnx"}), "already the cpu flavor"),
    (lambda t: t["flavors"]["cuda"].update(kv_dtype="int4"), "kv_dtype 'int4' is not one of"),
])
def test_schema_refuses_bad_flavor_fields(tiny_both_flavors_bundle, edit, words):
    d = _manifest(tiny_both_flavors_bundle)
    edit(d["models"]["target"])
    problems = check_schema(d)
    assert any(words in p for p in problems), problems


def test_verify_checks_each_graphs_dtypes_against_the_manifest(tiny_both_flavors_bundle, bundle_copy):
    manifest, problems = verify_cmd.check(tiny_both_flavors_bundle)
    assert problems == []
    b = bundle_copy(tiny_both_flavors_bundle)
    d = _manifest(b)
    d["models"]["target"]["flavors"]["cuda"]["kv_dtype"] = "float32"  # a lie about the cuda graph
    d["digest"] = content_digest(d)
    (b / MANIFEST_NAME).write_text(json.dumps(d))
    _, problems = verify_cmd.check(b)
    assert "target/model.cuda.onnx: past_key_values.0.key is float16, the manifest says float32" in problems
    assert any("the cuda flavor needs a float16 KV cache" in p for p in problems)


def test_verify_load_steps_every_flavor(tiny_both_flavors_bundle):
    _, problems = verify_cmd.check(tiny_both_flavors_bundle, checksums=False, load=True)
    assert problems == []


# --- which graph the runner loads -------------------------------------------------------------------
def test_choice_follows_the_first_provider_this_onnxruntime_has():
    f = facts(flavor="cpu", flavors={"cuda": {"path": "target/model.cuda.onnx", "kv_dtype": "float16"}})
    assert flavor.choose(f, flavor.first_usable([TRT, CUDA, CPU], [CUDA, CPU])).path == "target/model.cuda.onnx"
    assert flavor.choose(f, flavor.first_usable([TRT, CUDA, CPU], [CPU])).path == "target/model.onnx"
    assert flavor.choose(f, CPU).path == "target/model.onnx"
    only_cpu = facts()
    assert flavor.choose(only_cpu, CUDA) is only_cpu  # no cuda graph: the primary, judged by check()


def test_refusal_is_one_line_naming_the_fix(monkeypatch):
    monkeypatch.delenv(flavor.FORCE_ENV, raising=False)
    with pytest.raises(ProviderError) as e:
        flavor.check(facts(), "cuda")
    msg = str(e.value)
    assert "\n" not in msg and "--ep cuda" in msg and "target/model.onnx is the cpu flavor" in msg
    assert flavor.FORCE_ENV in msg
    flavor.check(facts(), "cuda", force=True)  # forced: allowed
    flavor.check(facts(kv_dtype="float16"), "cuda")  # a cuda graph on CUDA
    flavor.check(facts(kv_dtype="float16"), "cpu")  # a cuda graph on the CPU provider: allowed (tests)
    monkeypatch.setenv(flavor.FORCE_ENV, "1")
    flavor.check(facts(), "cuda")


class _SessionOn:
    """Wraps a real CPU session but reports `provider` as the one it got (a faked GPU session)."""

    def __init__(self, real, provider):
        self._real, self._provider = real, provider

    def get_providers(self):
        return [self._provider, CPU]

    def __getattr__(self, name):
        return getattr(self._real, name)


@pytest.fixture
def fake_cuda(monkeypatch):
    """onnxruntime with CUDA 'working': sessions run on the CPU but say CUDA; ModelRunner is recorded
    instead of built (its device buffers need a real GPU). Returns the recorded (path, facts, device)."""
    real = ort.InferenceSession
    made: list = []

    def session(path, so=None, providers=None, **kw):
        names = [p[0] if isinstance(p, tuple) else p for p in providers]
        return _SessionOn(real(path, so, providers=[CPU]), names[0])

    class Recorder:
        def __init__(self, session, facts, max_len, *args, device="cpu", device_id=0, **kw):
            made.append((session._real._model_path if hasattr(session._real, "_model_path") else None, facts, device))

        def slot(self, b):
            return self

    monkeypatch.setattr(ort, "get_available_providers", lambda: [CUDA, CPU])
    monkeypatch.setattr(ort, "InferenceSession", session)
    monkeypatch.setattr(runner_mod, "ModelRunner", Recorder)
    monkeypatch.delenv(flavor.FORCE_ENV, raising=False)
    return made


def test_cpu_flavored_bundle_on_cuda_is_refused(tiny_bundle_nodraft, fake_cuda):
    b = Bundle.open(tiny_bundle_nodraft)
    with pytest.raises(ProviderError, match=r"re-export with `edgespec export \.\.\. --ep cuda`"):
        runner_mod.load_runner(b.model_path("target"), b.target, 16, providers="cuda,cpu")
    assert fake_cuda == []
    runner_mod.load_runner(b.model_path("target"), b.target, 16, providers="cuda,cpu", force_flavor=True)
    assert [(f.graph_flavor(), d) for _, f, d in fake_cuda] == [("cpu", "cuda")]


def test_both_flavors_bundle_loads_the_cuda_graph_on_cuda(tiny_both_flavors_bundle, fake_cuda):
    b = Bundle.open(tiny_both_flavors_bundle)
    runner_mod.load_runner(b.model_path("target"), b.target, 16, providers="cuda,cpu")
    (_, f, device), = fake_cuda
    assert device == "cuda" and f.path == "target/model.cuda.onnx" and f.kv_dtype == "float16"


def test_both_flavors_bundle_falls_back_to_the_cpu_graph_when_cuda_fails(tiny_both_flavors_bundle, monkeypatch):
    real = ort.InferenceSession
    tried: list = []

    def session(path, so=None, providers=None, **kw):
        names = [p[0] if isinstance(p, tuple) else p for p in providers]
        tried.append((str(path).rsplit("/", 1)[-1], names[0]))
        if names[0] == CUDA:
            raise RuntimeError("CUDA EP failed: libcudart.so.12: cannot open shared object file")
        return real(path, so, providers=[CPU])

    monkeypatch.setattr(ort, "get_available_providers", lambda: [CUDA, CPU])
    monkeypatch.setattr(ort, "InferenceSession", session)
    b = Bundle.open(tiny_both_flavors_bundle)
    r = runner_mod.load_runner(b.model_path("target"), b.target, 16, providers="cuda,cpu")
    # the cuda graph was tried on CUDA (failed), then on the CPU, then swapped for the cpu graph
    assert tried[0] == ("model.cuda.onnx", CUDA) and tried[-1] == ("model.onnx", CPU)
    assert r.facts.path == "target/model.onnx" and r.facts.kv_dtype == "float32"
    assert np.isfinite(r.step([1, 2, 3], 1)).all()


def test_both_flavors_bundle_on_this_cpu_machine_runs_the_cpu_graph(tiny_both_flavors_bundle):
    eng = Engine.open(tiny_both_flavors_bundle, max_len=64, warmup=False)
    assert eng.target.facts.path == "target/model.onnx" and eng.draft_runner.facts.path == "draft/model.onnx"
    ref = eng.generate("def add(a, b):", max_new_tokens=16, draft="none")
    assert eng.generate("def add(a, b):", max_new_tokens=16, draft="model", k=3).token_ids == ref.token_ids


def test_cuda_graph_is_loaded_on_the_cpu_provider_when_it_is_the_only_one(tiny_cuda_bundle):
    b = Bundle.open(tiny_cuda_bundle)
    r = runner_mod.load_runner(b.model_path("target"), b.target, 16, providers="cpu")
    kv = r.runner.kv
    assert r.facts.graph_flavor() == "cuda" and kv[0].data_type() == "tensor(float16)"
    ptrs = [ov.data_ptr() for ov in kv]
    assert r.step([1, 2], 2).dtype == np.float32  # float32 logits (the exporter's Cast)
    r.step([3], 1)
    # float16 past and present bound to the same buffers: written in place, never reallocated
    assert [ov.data_ptr() for ov in kv] == ptrs
    assert np.abs(kv[0].numpy()[0, :, :3]).sum() > 0 and not kv[0].numpy()[0, :, 3:].any()


def test_export_refuses_fp32_cuda_and_unknown_flavors(tmp_path):
    pytest.importorskip("torch")
    from edgespec.errors import ExportError
    from edgespec_export.pipeline import ExportOptions, validate_options

    with pytest.raises(ExportError, match="fp32 has no cuda flavor"):
        validate_options(ExportOptions(quant="fp32", eps=("cuda",)))
    with pytest.raises(ExportError, match=r"--ep 'rocm': flavors are cpu, cuda"):
        validate_options(ExportOptions(eps="cpu,rocm"))
    o = ExportOptions(eps="cpu, cuda")
    validate_options(o)
    assert o.eps == ("cpu", "cuda")


def test_old_bundle_without_flavor_fields_still_verifies(tiny_bundle, bundle_copy):
    """A bundle written before flavors (no flavor/activation_dtype/flavors keys) is read as cpu."""
    b = bundle_copy(tiny_bundle)
    d = _manifest(b)
    for f in d["models"].values():
        for k in ("flavor", "activation_dtype", "flavors"):
            f.pop(k, None)
    d["digest"] = content_digest(d)
    (b / MANIFEST_NAME).write_text(json.dumps(d))
    m, problems = verify_cmd.check(b)
    assert problems == [] and m.models["target"].graph_flavor() == "cpu"
    assert replace(m.models["target"]).flavors == {}


def test_the_memory_plan_counts_the_graph_the_runner_loads(tiny_both_flavors_bundle, fake_cuda):
    """CUDA first: the cuda graph (float16 KV) is what gets loaded, and what the plan counts; its KV
    cache is device memory (the device side), not host memory."""
    from edgespec.edge import memory
    from edgespec.engine import build

    b = Bundle.open(tiny_both_flavors_bundle)
    on_cuda = build.memory_plan(b, max_len=256, want_draft=False, profile=None, budget=None, providers="cuda,cpu")
    on_cpu = build.memory_plan(b, max_len=256, want_draft=False, profile=None, budget=None, providers="cpu")
    assert on_cuda.device_breakdown["target_kv"] * 2 == on_cpu.breakdown["target_kv"]
    assert on_cuda.breakdown["target_kv"] == 0 and on_cpu.device_breakdown == {}
    assert not on_cuda.unified  # no profile: not known to share the DRAM, so the device side is reported apart
    cuda_graph = b.target.graphs()["cuda"]
    assert on_cuda.breakdown["target_weights"] == int(1.32 * memory.graph_file_bytes(b, cuda_graph))


def test_a_cuda_graph_is_refused_on_a_cpu_without_float16(monkeypatch):
    """A Raspberry Pi 4 (Cortex-A72, no ARMv8.2 FP16) would die on an illegal instruction in the
    float16 kernels: one clear line instead, and no override (it would crash)."""
    assert flavor.cpu_runs_float16("x86_64") is True
    assert flavor.cpu_runs_float16("aarch64", hwcap=0b11111111) is False  # fp asimd ... no asimdhp
    assert flavor.cpu_runs_float16("aarch64", hwcap=1 << 10) is True  # Cortex-A76 / Orin's A78AE
    cuda = facts(flavor="cuda", kv_dtype="float16")
    monkeypatch.setattr(flavor, "cpu_runs_float16", lambda: False)
    with pytest.raises(ProviderError, match="cannot run .*--ep cpu"):
        flavor.check(cuda, "cpu", force=True)
    monkeypatch.setattr(flavor, "cpu_runs_float16", lambda: True)
    flavor.check(cuda, "cpu")  # allowed where the CPU can


# --- one flavor choice on every path (issue 19) ----------------------------------------------------
def test_batch_engine_refuses_a_cpu_graph_on_cuda(tiny_bundle_nodraft, fake_cuda):
    """`serve --parallel N` opens its graph through the same choice as Engine: the same refusal."""

    with pytest.raises(ProviderError, match=r"is the cpu flavor .* re-export with `edgespec export \.\.\. --ep cuda`"):
        Engine.open(tiny_bundle_nodraft, parallel=2, providers="cuda,cpu", verify=False, warmup=False)


def test_batched_runner_judges_the_graph_the_flavor_choice_loads(tiny_both_flavors_bundle, fake_cuda):
    """With both flavors, the batched runner's choice is load_runner's: on CUDA the cuda graph (which
    batches a pass per multi-token row, core/runner.py); on the CPU, the cpu graph."""
    b = Bundle.open(tiny_both_flavors_bundle)
    runner_mod.load_model(b.model_path("target"), b.target, 32, slots=2, providers="cuda,cpu")
    runner_mod.load_model(b.model_path("target"), b.target, 32, slots=2, providers="cpu")
    (_, on_cuda, d1), (_, on_cpu, d2) = fake_cuda
    assert (d1, on_cuda.path, on_cuda.kv_dtype) == ("cuda", "target/model.cuda.onnx", "float16")
    assert (d2, on_cpu.path, on_cpu.kv_dtype) == ("cpu", "target/model.onnx", "float32")


def test_plan_counts_the_graph_the_engine_loads(tiny_both_flavors_bundle, monkeypatch):
    """`edgespec plan` picks the graph through flavor.planned, the engine's own choice: planned for an
    Orin from elsewhere (its profile's order) the cuda graph on CUDA; here, with only the CPU provider,
    the cpu graph."""
    from edgespec.edge.boardfit import runs_on as _runs_on
    from edgespec.edge import devices

    b = Bundle.open(tiny_both_flavors_bundle)
    orin = devices.get("orin-nano")
    monkeypatch.setattr(ort, "get_available_providers", lambda: [CPU])
    assert _runs_on(b, orin, here=False) == ("cuda", "cuda")
    assert _runs_on(b, orin, here=True) == ("cpu", "cpu")
    assert flavor.planned(b.target, ["cuda", "cpu"], [CUDA, CPU]).path == "target/model.cuda.onnx"
    assert flavor.planned(b.target, ["cuda", "cpu"], [CPU]).path == "target/model.onnx"
