"""On a real GPU: the cuda-flavored graphs on the CUDA provider (scripts/gpu-check.sh runs this).

Skips, with the reason, wherever this onnxruntime has no working CUDA provider (a CPU-only wheel,
or onnxruntime-gpu without the CUDA libraries). Nothing here is faked: the fakes of the same
logic are in test_flavor.py and test_providers.py.
"""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from edgespec.edge import providers
from edgespec.models.bundle import Bundle
from edgespec.models.kernels import floor_problem
from edgespec.errors import ProviderError
from edgespec.edge.providers import CPU, CUDA


def _cuda_reason() -> str | None:
    if CUDA not in ort.get_available_providers():
        return f"this onnxruntime ({ort.__version__}) has no CUDA provider: pip install onnxruntime-gpu on a machine with an NVIDIA GPU"
    r = {p.provider: p for p in providers.probe("cuda")}[CUDA]
    if not r.works:
        return f"the CUDA provider is in this onnxruntime but does not work here: {r.error}"
    return None


REASON = _cuda_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")


def test_cuda_flavor_runs_gqa_and_matmulnbits_on_cuda_without_memcpy_in_layers(tiny_cuda_bundle):
    from edgespec.bench.placement import KEY_OPS, measure

    b = Bundle.open(tiny_cuda_bundle)
    p = measure(b.model_path("target"), b.target, "cuda,cpu")
    assert p.providers[0] == CUDA
    for op in KEY_OPS:
        assert p.by_op.get(op, {}).get(CUDA, 0) > 0, p.by_op
    assert p.off_provider(CUDA) == [], p.by_op
    assert p.memcpy_inside_layers() == [], p.memcpy_nodes


def test_cuda_runner_keeps_the_kv_cache_on_the_device_written_in_place(tiny_cuda_bundle):
    from edgespec.engine.build import load_runner

    b = Bundle.open(tiny_cuda_bundle)
    r = load_runner(b.model_path("target"), b.target, 32, providers="cuda,cpu")
    assert r.session.get_providers()[0] == CUDA
    assert all(ov.device_name().lower() == "cuda" for ov in r.runner.kv)
    assert r.runner.kv[0].data_type() == "tensor(float16)"
    ptr = r.runner.kv[0].data_ptr()
    logits = r.step([1, 2, 3], 1)
    assert logits.dtype == np.float32 and np.isfinite(logits).all()
    r.step([4], 1)
    assert r.runner.kv[0].data_ptr() == ptr  # the same device buffer: bound in place, never reallocated


def test_greedy_speculative_equals_target_alone_on_cuda(tiny_cuda_bundle):
    """On CUDA, 1-row and k-row MatMulNBits take different kernels: any near-tie could flip.
    The tiny models' peaked logits make that rare; a failure names the prompt."""
    from edgespec.engine import Engine

    eng = Engine.open(tiny_cuda_bundle, max_len=256, providers="cuda,cpu")
    rng = np.random.default_rng(0)
    for i in range(4):
        prompt = eng.tokenizer.decode(rng.integers(3, eng.vocab.usable, size=12).tolist()) or "x"
        ref = eng.generate(prompt, max_new_tokens=32, draft="none")
        for mode, k in (("model", 1), ("model", 4), ("model", 8), ("ngram", 4), ("auto", None)):
            assert eng.generate(prompt, max_new_tokens=32, draft=mode, k=k).token_ids == ref.token_ids, (i, mode, k)


@pytest.mark.skipif(floor_problem(ort.__version__, "cpu") is not None,
                    reason=f"onnxruntime {ort.__version__} is below the cpu flavor's floor (kernels.ORT_FLOORS): "
                           f"no cpu-flavored bundle can be built or loaded here")
def test_cpu_flavored_bundle_is_refused_on_cuda(tiny_bundle_nodraft, monkeypatch):
    from edgespec.edge import flavor
    from edgespec.engine.build import load_runner

    monkeypatch.delenv(flavor.FORCE_ENV, raising=False)
    b = Bundle.open(tiny_bundle_nodraft)
    with pytest.raises(ProviderError, match="--ep cuda"):
        load_runner(b.model_path("target"), b.target, 16, providers="cuda,cpu")
    r = load_runner(b.model_path("target"), b.target, 16, providers="cpu")  # the named fix works
    assert r.session.get_providers() == [CPU]


def test_device_memory_is_measurable(tiny_cuda_bundle):
    from edgespec.edge.gpumem import device_memory

    m = device_memory()
    assert m is not None and 0 < m.free <= m.total, m


def test_the_cuda_context_is_measured_from_outside_cuda():
    """NVML (a discrete GPU) or MemAvailable (a Jetson), read in a fresh process before and after a
    CUDA session exists: a CUDA context costs tens to hundreds of MB, never nothing."""
    from edgespec.edge.gpumem import measure_context_fresh

    m = measure_context_fresh()
    assert m.get("context_bytes", 0) > 32 << 20, m
