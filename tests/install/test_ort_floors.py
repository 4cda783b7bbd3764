"""The runtime on the onnxruntime this environment has: scripts/ci-ort.sh runs this file (with the
loader, runner and lossless quick tests) on onnxruntime 1.23.2 (the last Python 3.10 release, the cpu
flavor's floor; a 1.23 like the cuda flavor's floor, NVIDIA's JetPack 6 wheel 1.23.0) and 1.24.1 (PyPI's
build of the 1.24.0 sources), CPU provider; EDGESPEC_EXPECT_ORT names the version it must find."""
from __future__ import annotations

import os

import onnxruntime
import pytest

from edgespec.engine import Engine
from edgespec.errors import OnnxruntimeTooOld
from edgespec.models.kernels import ORT_FLOORS, floor_problem, version_tuple


def test_the_onnxruntime_is_the_one_asked_for():
    want = os.environ.get("EDGESPEC_EXPECT_ORT")
    if not want:
        pytest.skip("EDGESPEC_EXPECT_ORT is not set (scripts/ci-ort.sh sets it)")
    assert onnxruntime.__version__ == want, onnxruntime.__file__


def test_every_onnxruntime_ci_runs_is_at_both_floors():
    assert floor_problem(onnxruntime.__version__, "cpu") is None and floor_problem(onnxruntime.__version__, "cuda") is None
    assert max(version_tuple(f) for f in ORT_FLOORS.values()) <= version_tuple("1.23.2")  # the last cp310 release


def test_a_cpu_bundle_generates_greedy_equal_to_the_target_alone(tiny_bundle):
    eng = Engine.open(tiny_bundle, max_len=128, verify=False, warmup=False, providers="cpu")
    try:
        spec = eng.generate(prompt="hello hello hello world", max_new_tokens=16, draft="ngram")
        eng.reset_cache()
        alone = eng.generate(prompt="hello hello hello world", max_new_tokens=16, draft="none")
        assert spec.token_ids == alone.token_ids and len(spec.token_ids) == 16
    finally:
        eng.close()


def test_a_cuda_bundle_generates_at_its_floor_and_names_it_below(tiny_cuda_bundle):
    problem = floor_problem(onnxruntime.__version__, "cuda")
    if problem:
        with pytest.raises(OnnxruntimeTooOld) as e:
            Engine.open(tiny_cuda_bundle, max_len=64, verify=False, warmup=False, providers="cpu")
        assert str(e.value) == problem and "\n" not in problem
        return
    eng = Engine.open(tiny_cuda_bundle, max_len=64, verify=False, warmup=False, providers="cpu")
    try:
        assert len(eng.generate(prompt="1 2 3 1 2 3", max_new_tokens=12, draft="ngram").token_ids) == 12
    finally:
        eng.close()
