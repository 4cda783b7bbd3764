"""The onnxruntime floor, per graph flavor (kernels.ORT_FLOORS), set by what the boards have.

The cpu flavor: 1.23.2 (the last cp310 release), its batching input dropped at load where the installed
onnxruntime lacks it (models/ortcompat.py); the cuda flavor: 1.23.0, the older of NVIDIA's JetPack 6 wheels
(its position_ids taken out below 1.24.0). Versions
are faked (onnxruntime.__version__ monkeypatched); the graphs are the tiny test bundles. The real old
releases run in scripts/ci-ort.sh.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import onnx
import pytest

from edgespec.models.kernelcheck import check_graph
from edgespec.models.kernels import FLOOR_SOURCES, ORT_FLOOR, ORT_FLOORS, floor_problem

CPU_FLOOR, CUDA_FLOOR = ORT_FLOORS["cpu"], ORT_FLOORS["cuda"]
GPU_WHEEL = "1.24.0"  # NVIDIA's JetPack 6 onnxruntime-gpu (jp6/cu126 has 1.23.0 and 1.24.0)


def _graph(bundle: Path, role: str = "target") -> Path:
    return bundle / json.loads((bundle / "manifest.json").read_text())["models"][role]["path"]


def _gqa(path: Path) -> list:
    return [n for n in onnx.load(str(path), load_external_data=False).graph.node if n.op_type == "GroupQueryAttention"]


def test_each_floor_cites_its_evidence():
    assert set(FLOOR_SOURCES) == set(ORT_FLOORS)
    assert all(ORT_FLOORS[f] in FLOOR_SOURCES[f] for f in ORT_FLOORS)


def test_the_floors_are_what_the_boards_have():
    assert ORT_FLOOR == CPU_FLOOR == "1.23.2"  # the last onnxruntime with Python 3.10 wheels
    assert CUDA_FLOOR == "1.23.0"  # NVIDIA's JetPack 6 wheels are 1.23.0 and 1.24.0: both run the cuda flavor
    assert floor_problem("1.23.0", "cuda") is None and floor_problem(GPU_WHEEL, "cuda") is None
    assert floor_problem(GPU_WHEEL, "cpu") is None
    assert f"onnxruntime 1.22.1 is older than {CUDA_FLOOR}" in floor_problem("1.22.1", "cuda")
    assert "JetPack 5 (Python 3.8) is not supported" in floor_problem("1.22.1", "cuda")
    assert f"onnxruntime 1.22.1 is older than {CPU_FLOOR}" in floor_problem("1.22.1", "cpu")
    assert "edgespec[cpu]" in floor_problem("1.22.1", "cpu")


def test_cuda_export_wires_no_query_seqlens(tiny_cuda_bundle, tiny_both_flavors_bundle):
    for role in ("target", "draft"):
        gqa = _gqa(_graph(tiny_cuda_bundle, role))
        assert gqa and all(len(n.input) <= 16 or n.input[16] == "" for n in gqa), role
    both = json.loads((tiny_both_flavors_bundle / "manifest.json").read_text())["models"]["target"]
    cpu_gqa = _gqa(tiny_both_flavors_bundle / both["path"])  # the cpu flavor keeps batching
    assert cpu_gqa and all(n.input[16] == "/edgespec/padded_queries/query_seqlens" for n in cpu_gqa)


def test_kernel_checker_passes_the_cuda_graph_and_refuses_one_with_query_seqlens(tiny_cuda_bundle, tmp_path):
    from edgespec_export.graph_batch import add_padded_queries

    graph = _graph(tiny_cuda_bundle)
    assert check_graph(graph, "cuda") == []
    old = tmp_path / "model.onnx"  # today's main before the floor split: the batching edit on the cuda flavor
    shutil.copy(graph, old)
    assert add_padded_queries(old)
    found = check_graph(old, "cuda")
    assert {v.rule for v in found} == {"GroupQueryAttention.query_seqlens.absent"} and len(found) == 2
    assert "re-export the bundle" in found[0].line("cuda") and "\n" not in found[0].line("cuda")


def test_export_below_the_flavor_s_floor_is_one_line(monkeypatch, tiny_cuda_bundle, tiny_bundle):
    import onnxruntime
    from edgespec_export.contract import check_kernels

    from edgespec.errors import ExportError

    monkeypatch.setattr(onnxruntime, "__version__", GPU_WHEEL)
    check_kernels(_graph(tiny_cuda_bundle), "cuda", "target")  # the JetPack wheel can export the cuda flavor
    check_kernels(_graph(tiny_bundle), "cpu", "target")
    monkeypatch.setattr(onnxruntime, "__version__", "1.22.1")
    with pytest.raises(ExportError) as e:
        check_kernels(_graph(tiny_bundle), "cpu", "target")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("the cpu graph of target cannot be checked with this onnxruntime")
    assert f"onnxruntime 1.22.1 is older than {CPU_FLOOR}" in msg


def test_the_jetpack_wheel_version_loads_both_flavors_and_an_older_one_is_one_line(monkeypatch, tiny_cuda_bundle,
                                                                                   tiny_bundle):
    import onnxruntime

    from edgespec.engine.build import load_runner
    from edgespec.errors import OnnxruntimeTooOld
    from edgespec.models.bundle import Bundle

    monkeypatch.setattr(onnxruntime, "__version__", GPU_WHEEL)
    for path in (tiny_cuda_bundle, tiny_bundle):
        b = Bundle.open(path)
        r = load_runner(b.model_path("target"), b.target, max_len=16, providers="cpu")
        assert r.step([1, 2, 3], n_logits=1).shape == (1, b.target.vocab_size)
    monkeypatch.setattr(onnxruntime, "__version__", "1.22.1")
    cpu = Bundle.open(tiny_bundle)
    with pytest.raises(OnnxruntimeTooOld) as e:
        load_runner(cpu.model_path("target"), cpu.target, max_len=16, providers="cpu")
    msg = str(e.value)
    assert "\n" not in msg and f"onnxruntime 1.22.1 is older than {CPU_FLOOR}" in msg
    assert "cpu-flavored" in msg and "--ep cuda" in msg


def test_below_the_cuda_floor_is_one_line_naming_the_gpu_wheel(monkeypatch, tiny_cuda_bundle):
    import onnxruntime

    from edgespec.engine.build import load_runner
    from edgespec.errors import OnnxruntimeTooOld
    from edgespec.models.bundle import Bundle

    monkeypatch.setattr(onnxruntime, "__version__", "1.22.1")  # no float16 GatherBlockQuantized
    b = Bundle.open(tiny_cuda_bundle)
    with pytest.raises(OnnxruntimeTooOld) as e:
        load_runner(b.model_path("target"), b.target, max_len=16, providers="cpu")
    msg = str(e.value)
    assert "\n" not in msg and f"onnxruntime 1.22.1 is older than {CUDA_FLOOR}" in msg
    assert f"'onnxruntime-gpu>={CUDA_FLOOR}'" in msg and "JetPack" in msg


def test_a_graph_of_unknown_flavor_is_held_to_the_lowest_floor():
    low = min(ORT_FLOORS.values(), key=lambda v: tuple(map(int, v.split("."))))
    assert floor_problem(low, None) is None
    assert f"onnxruntime 1.20.1 is older than {low}" in floor_problem("1.20.1", None)


def test_a_cuda_graph_batches_a_pass_per_row(tiny_cuda_bundle):
    """No onnxruntime-gpu takes query_seqlens: the batched runner takes the cuda graph and verifies a
    pass per multi-token row (tests/engine/test_batch_per_row.py: the outputs)."""
    import onnxruntime

    from edgespec.core.runner import ModelRunner
    from edgespec.edge.providers import session_options
    from edgespec.models.bundle import Bundle

    b = Bundle.open(tiny_cuda_bundle)
    s = onnxruntime.InferenceSession(str(b.model_path("target")), session_options(), providers=["CPUExecutionProvider"])
    assert not ModelRunner(s, b.target, 32, 2).one_pass
    assert ModelRunner(s, b.target, 32, 1).one_pass  # one slot: every step is the serial runner's


def test_pyproject_s_cpu_extra_requires_the_cpu_floor():
    text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert f'cpu = ["onnxruntime>={CPU_FLOOR}"]' in text


def test_doctor_names_each_flavor_s_floor(monkeypatch):
    import onnxruntime

    from edgespec.edge.doctor import collect, render

    monkeypatch.setattr(onnxruntime, "__version__", "1.23.1")  # NVIDIA's floor line, before PyPI's last cp310
    report = collect(probe=False)
    assert report["onnxruntime"]["floors"] == ORT_FLOORS
    assert set(report["onnxruntime"]["below_floor"]) == {"cpu"}
    text = render(report)
    assert f"TOO OLD for the cpu flavor: onnxruntime 1.23.1 is older than {CPU_FLOOR}" in text
    assert "TOO OLD for the cuda flavor" not in text and f">= {CUDA_FLOOR} for the cuda flavor" in text


def test_board_profiles_name_the_cuda_floor():
    from edgespec.edge import devices

    for name in ("jetson-orin-nano-8gb", "jetson-orin-nx-16gb", "jetson-agx-orin-64gb", "generic-x86_64"):
        hint = devices.resolve(name).install["onnxruntime-gpu"]
        assert f"onnxruntime-gpu>={CUDA_FLOOR}" in hint and f"onnxruntime-gpu>={CPU_FLOOR}" not in hint, name
