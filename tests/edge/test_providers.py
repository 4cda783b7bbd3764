"""Execution providers: order, options, fallback with a provider that fails or is missing, the
draft on a different provider than the target, and the probe doctor uses."""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from edgespec.edge import devices

from edgespec.edge import providers
from edgespec.errors import InvalidRequest, ProviderError
from edgespec.edge.providers import CPU, CUDA, TRT


# an onnxruntime-gpu build (a Jetson, scripts/gpu-check.sh) really tries TensorRT/CUDA by default;
# the tests of this CPU-only default skip there (tests/bench/test_gpu.py covers that side)
GPU_BUILD = bool({TRT, CUDA} & set(ort.get_available_providers()))
cpu_only_build = pytest.mark.skipif(GPU_BUILD, reason="this onnxruntime has a GPU provider: tests/bench/test_gpu.py covers it")


@pytest.fixture
def fake_gpu_build(monkeypatch):
    """Pretend this onnxruntime was built with TensorRT and CUDA, whose sessions fail to create
    (as they do on a board without the CUDA libraries), and record every session's provider list."""
    real = ort.InferenceSession
    created: list[list] = []
    failing = {TRT: "TensorRT EP could not be created: libnvinfer.so.10: cannot open shared object file",
               CUDA: "CUDA EP failed: libcudart.so.12: cannot open shared object file"}

    def session(path_or_bytes, so=None, providers=None, **kw):
        names = [p[0] if isinstance(p, tuple) else p for p in providers]
        created.append(names)
        if names[0] in failing:
            raise RuntimeError(failing[names[0]] + "\nmore lines of onnxruntime detail")
        return real(path_or_bytes, so, providers=[p for p in providers if (p[0] if isinstance(p, tuple) else p) == CPU])

    monkeypatch.setattr(ort, "get_available_providers", lambda: [TRT, CUDA, CPU])
    monkeypatch.setattr(ort, "InferenceSession", session)
    return created


def model_file(tmp_path) -> Path:
    p = tmp_path / "probe.onnx"
    p.write_bytes(providers.probe_model_bytes())
    return p


def test_normalize():
    assert providers.normalize(None) == [CUDA, CPU]  # TensorRT only by name (docs/edge.md)
    assert providers.normalize("cuda, cpu") == [CUDA, CPU]
    assert providers.normalize(["TRT", "CPUExecutionProvider", "cpu"]) == [TRT, CPU]
    with pytest.raises(InvalidRequest) as e:
        providers.normalize("cdua")
    assert "cdua" in str(e.value) and e.value.param == "providers"
    with pytest.raises(InvalidRequest):
        providers.normalize(" , ")


@cpu_only_build
def test_default_order_quietly_skips_what_this_build_lacks(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="edgespec.edge.providers"):
        sess, device = providers.create_session(model_file(tmp_path))
    assert device == "cpu" and sess.get_providers()[0] == CPU
    assert caplog.records == []


def test_failing_provider_falls_back_with_one_line_each(tmp_path, caplog, fake_gpu_build):
    with caplog.at_level(logging.WARNING, logger="edgespec.edge.providers"):
        sess, device = providers.create_session(model_file(tmp_path), providers=providers.ProfileOrder([TRT, CUDA, CPU]))
    assert device == "cpu"
    # TensorRT (asked for) is tried with CUDA and CPU behind it (node-level fallback), then CUDA, then CPU
    assert fake_gpu_build == [[TRT, CUDA, CPU], [CUDA, CPU], [CPU]]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert "provider tensorrt failed" in lines[0] and "libnvinfer" in lines[0] and "\n" not in lines[0]
    assert "provider cuda failed" in lines[1] and "libcudart" in lines[1]


@cpu_only_build
def test_explicit_missing_provider_is_logged_then_next_one_used(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="edgespec.edge.providers"):
        sess, device = providers.create_session(model_file(tmp_path), providers="cuda,cpu")
    assert device == "cpu"
    assert len(caplog.records) == 1 and "cuda requested but this onnxruntime does not have it" in caplog.records[0].getMessage()


def test_explicit_list_without_cpu_fails_with_every_reason(tmp_path, fake_gpu_build):
    with pytest.raises(ProviderError) as e:
        providers.create_session(model_file(tmp_path), providers="tensorrt,cuda")
    msg = str(e.value)
    assert "libnvinfer" in msg and "libcudart" in msg and "add cpu" in msg


def test_onnxruntime_silent_fallback_is_detected(tmp_path, monkeypatch, caplog):
    """onnxruntime's wrapper may swallow a provider error and hand back a CPU session."""
    real = ort.InferenceSession
    monkeypatch.setattr(ort, "get_available_providers", lambda: [CUDA, CPU])
    monkeypatch.setattr(ort, "InferenceSession", lambda p, so=None, providers=None, **kw: real(p, so, providers=[CPU]))
    with caplog.at_level(logging.WARNING, logger="edgespec.edge.providers"):
        sess, device = providers.create_session(model_file(tmp_path), providers="cuda,cpu")
    assert device == "cpu"
    assert any("onnxruntime fell back to cpu" in r.getMessage() for r in caplog.records)


def test_tensorrt_options_cache_in_state_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    opts = providers.default_provider_options(TRT)
    assert opts["trt_engine_cache_enable"] is True and opts["trt_fp16_enable"] is True
    assert opts["trt_engine_cache_path"] == str(tmp_path / "home" / "trt-cache")
    assert opts["trt_max_workspace_size"] == 1 << 30
    monkeypatch.setenv("STATE_DIRECTORY", f"{tmp_path / 'state'}:{tmp_path / 'other'}")  # systemd may list several
    assert providers.trt_cache_dir() == tmp_path / "state" / "trt-cache"
    agx = providers.default_provider_options(TRT, profile=devices.get("jetson-agx-orin-64gb"))
    assert agx["trt_max_workspace_size"] == 2 << 30
    assert providers.default_provider_options(CUDA)["arena_extend_strategy"] == "kSameAsRequested"


def test_tensorrt_attempt_creates_its_cache_folder(tmp_path, monkeypatch, fake_gpu_build):
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "state"))
    providers.create_session(model_file(tmp_path), providers="tensorrt,cuda,cpu")
    assert (tmp_path / "state" / "trt-cache").is_dir()


def test_spinning_option_reaches_the_session(tmp_path, monkeypatch):
    # an earlier test in this process may have set up the shared pool; per-session threads need it off
    monkeypatch.setattr(providers, "_shared_pool", {})
    so = providers.session_options(2, spinning=False)
    assert so.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert so.intra_op_num_threads == 2 and so.use_per_session_threads


def test_shared_pool_overrides_per_session_threads(monkeypatch):
    monkeypatch.setattr(providers, "_shared_pool", {"ok": True, "threads": 2})
    so = providers.session_options(2)
    assert not so.use_per_session_threads and so.intra_op_num_threads == 0


def test_probe_model_is_valid_onnx_and_computes():
    onnx = pytest.importorskip("onnx")
    m = onnx.load_from_string(providers.probe_model_bytes())
    onnx.checker.check_model(m, full_check=True)
    results = {r.provider: r for r in providers.probe()}
    assert results[CPU].works and results[CPU].error is None
    # whatever this onnxruntime is (CPU-only wheel, or onnxruntime-gpu on a Jetson): the probe says so
    assert results[CUDA].in_build == (CUDA in ort.get_available_providers())
    if not results[CUDA].in_build:
        assert not results[CUDA].works and "onnxruntime-gpu" in results[CUDA].error


def test_probe_reports_a_provider_that_is_in_the_build_but_fails(fake_gpu_build):
    results = {r.provider: r for r in providers.probe("cuda,cpu")}
    assert results[CUDA].in_build and not results[CUDA].works and "libcudart" in results[CUDA].error
    assert results[CPU].works


def test_probe_catches_a_wrong_answer(monkeypatch):
    real = ort.InferenceSession

    class Wrong:
        def __init__(self, *a, **k):
            self.s = real(*a, **k)

        def get_providers(self):
            return self.s.get_providers()

        def run(self, out, feeds):
            return [np.zeros((1, 8), np.float32)]

    monkeypatch.setattr(ort, "InferenceSession", Wrong)
    (r,) = providers.probe("cpu")
    assert not r.works and "wrong result" in r.error


def test_draft_runs_on_its_own_providers_and_output_is_unchanged(tiny_bundle, fake_gpu_build, caplog):
    """Target asks for CUDA (fails here, falls back to CPU with a log line); the draft is told to
    use the CPU only. Speculative output must equal the target alone's."""
    from edgespec.engine import Engine

    with caplog.at_level(logging.WARNING, logger="edgespec.edge.providers"):
        eng = Engine.open(tiny_bundle, draft="model", providers="cuda,cpu", draft_providers="cpu", verify=False)
    try:
        # target: [cuda, cpu] fails, then [cpu]; draft: [cpu] only, never cuda
        assert fake_gpu_build == [[CUDA, CPU], [CPU], [CPU]]
        assert sum("provider cuda failed" in r.getMessage() for r in caplog.records) == 1
        spec = eng.generate("the quick brown fox", max_new_tokens=24, draft="model", k=3)
        alone = eng.generate("the quick brown fox", max_new_tokens=24, draft="none")
        assert spec.token_ids == alone.token_ids
        assert spec.stats.drafted > 0
    finally:
        eng.close()


def test_profile_order_skips_missing_providers_quietly_like_the_default(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="edgespec.edge.providers"):
        sess, device = providers.create_session(model_file(tmp_path),
                                                providers=providers.ProfileOrder(["tensorrt", "cuda", "cpu"]))
    assert device == "cpu" and caplog.records == []
    with caplog.at_level(logging.WARNING, logger="edgespec.edge.providers"):
        providers.create_session(model_file(tmp_path), providers=["tensorrt", "cuda", "cpu"])  # typed by a user
    assert len(caplog.records) == 2


def test_spinning_off_is_refused_loudly_on_the_shared_pool(monkeypatch, caplog):
    """onnxruntime ignores allow_spinning for its global pool: asking for it must not look like it worked."""
    monkeypatch.setattr(providers, "_shared_pool", {"ok": True, "threads": 2})
    monkeypatch.setattr(providers, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="edgespec.edge.providers"):
        so = providers.session_options(2, spinning=False, shared_threads=True)
        providers.session_options(2, spinning=False, shared_threads=True)
    with pytest.raises(RuntimeError):  # not set: onnxruntime has no such entry
        so.get_session_config_entry("session.intra_op.allow_spinning")
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == 1 and "no effect" in msgs[0] and "shared thread pool" in msgs[0]


@pytest.fixture
def recorded_loads(monkeypatch):
    """What Engine.open hands load_model, per model (the real load_model still runs)."""
    import edgespec.engine.build as engine_mod

    real = engine_mod.load_model
    calls: list[dict] = []

    def spy(path, facts, max_len, **kw):
        calls.append({"model": Path(path).parent.name, **kw})
        return real(path, facts, max_len, **kw)

    monkeypatch.setattr(engine_mod, "load_model", spy)
    return calls


def test_named_device_fills_unset_options(tiny_bundle, recorded_loads, fake_gpu_build):
    """Orin Nano profile: target CUDA -> CPU (TensorRT is out of the default order: docs/edge.md,
    "TensorRT"), draft CUDA -> CPU, 6 threads. Here CUDA fails, so both models end on the CPU."""
    from edgespec.engine import Engine

    eng = Engine.open(tiny_bundle, draft="model", device="orin-nano", verify=False, warmup=False)
    try:
        target, draft = recorded_loads
        assert target["model"] == "target" and draft["model"] == "draft"
        assert providers.normalize(target["providers"]) == [CUDA, CPU]
        assert providers.normalize(draft["providers"]) == [CUDA, CPU]
        # the profile's 6, never above the cores online where it runs (devices.online_cores)
        assert target["threads"] == draft["threads"] == min(6, devices.online_cores() or 6)
        assert target["profile"].id == draft["profile"].id == "jetson-orin-nano-8gb"
        assert fake_gpu_build == [[CUDA, CPU], [CPU], [CUDA, CPU], [CPU]]
        # a named board: a governor measures energy where it has a sensor; the Orin Nano profile sets
        # no temperature limit and nothing asked for a power budget, so it limits nothing
        assert (eng.governor.power_budget_w, eng.governor.max_temp_c) == (None, None)
    finally:
        eng.close()


def test_explicit_options_win_over_the_device_profile(tiny_bundle, recorded_loads, fake_gpu_build):
    from edgespec.engine import Engine

    eng = Engine.open(tiny_bundle, draft="model", device="orin-nano", providers="cpu", threads=2, verify=False,
                      warmup=False)
    eng.close()
    assert [providers.normalize(c["providers"]) for c in recorded_loads] == [[CPU], [CPU]]  # the draft follows
    assert [c["threads"] for c in recorded_loads] == [2, 2]
    assert fake_gpu_build == [[CPU], [CPU]]


def test_profile_sets_the_tensorrt_workspace(tmp_path, monkeypatch, fake_gpu_build):
    seen = {}
    real = ort.InferenceSession

    def session(path_or_bytes, so=None, providers=None, **kw):
        for p in providers:
            if isinstance(p, tuple):
                seen[p[0]] = p[1]
        return real(path_or_bytes, so, providers=[CPU])

    monkeypatch.setattr(ort, "InferenceSession", session)
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    trt_first = "tensorrt,cuda,cpu"  # TensorRT is not in the default order any more: asked for by name
    providers.create_session(model_file(tmp_path), providers=trt_first, profile=devices.get("orin-nano"))
    assert seen[TRT]["trt_max_workspace_size"] == 1 << 30  # the Orin Nano's 1 GiB, not the 2 GiB of the others
    providers.create_session(model_file(tmp_path), providers=trt_first, profile=devices.get("orin-nx"))
    assert seen[TRT]["trt_max_workspace_size"] == 2 << 30


@cpu_only_build
def test_device_auto_on_this_machine_changes_nothing_it_should_not(tiny_bundle, recorded_loads, caplog):
    """Here (no GPU, generic profile): quiet, same text as without a device."""
    from edgespec.engine import Engine

    ref = Engine.open(tiny_bundle, verify=False, warmup=False)
    want = ref.generate("the quick brown fox", max_new_tokens=16, draft="none").token_ids
    ref.close()
    with caplog.at_level(logging.WARNING, logger="edgespec.edge.providers"):
        eng = Engine.open(tiny_bundle, device="auto", verify=False, warmup=False)
    try:
        assert caplog.records == []
        assert recorded_loads[-1]["profile"].id == devices.detect().id
        assert eng.generate("the quick brown fox", max_new_tokens=16).token_ids == want
    finally:
        eng.close()


@pytest.mark.parametrize("kw,param,words", [
    ({"device": "orin-nanoo"}, "device", "known devices"),
    ({"device": 7}, "device", "name or 'auto'"),
    ({"providers": "gpu"}, "providers", "unknown execution provider"),
    ({"draft_providers": "gpu,cpu"}, "draft_providers", "draft providers"),
    ({"threads": 0}, "threads", "from 1 to 1024"),
    ({"threads": 2.5}, "threads", "integer"),
    ({"threads": True}, "threads", "integer"),
    ({"memory_budget": "lots"}, "memory_budget", "not a memory size"),
    ({"memory_budget": "0G"}, "memory_budget", "positive"),
    ({"power_budget": "hot"}, "power_budget", "power budget"),
    ({"power_budget": -5}, "power_budget", "positive"),
    ({"max_temp": "500C"}, "max_temp", "0-150"),
])
def test_bad_edge_options_fail_before_the_bundle_is_read(tmp_path, kw, param, words):
    """The bundle path does not even exist: the option error must come first, and name the option."""
    from edgespec.engine import Engine

    with pytest.raises(InvalidRequest) as e:
        Engine.open(tmp_path / "no-such-bundle", **kw)
    assert e.value.param == param and words in str(e.value)
