"""Device memory, honestly (edge/gpumem.py, the device side of edge/memory.py, engine/measure.py,
`plan --measure`), with fakes: no GPU here. The CUDA context's own cost is read from outside CUDA
(a faked NVML; a faked /proc/meminfo on a unified-memory board) before and after a session exists;
on a Jetson profile host and device add up against the budget, on a discrete GPU they stay apart."""
from __future__ import annotations

import ctypes
import json
import shutil
from pathlib import Path

import pytest

from edgespec.cli import main as cli
from edgespec.edge import devices, gpumem, memory
from edgespec.errors import BudgetError

MIB = 1 << 20
FAKES = Path(__file__).parents[1] / "fakes"


class FakeNvml:
    """libnvidia-ml's three calls as ctypes sees them; `free` is what the next memory read returns."""

    def __init__(self, free: int, total: int = 16 << 30, init_rc: int = 0):
        self.free, self.total, self.init_rc, self.reads = free, total, init_rc, 0

    def nvmlInit_v2(self):
        return self.init_rc

    def nvmlDeviceGetHandleByIndex_v2(self, index, handle_ref):
        return 0 if index.value == 0 else 3  # NVML_ERROR_INVALID_ARGUMENT

    def nvmlDeviceGetMemoryInfo(self, handle, mem_ref):
        self.reads += 1
        mem_ref._obj.free, mem_ref._obj.total = self.free, self.total
        mem_ref._obj.used = self.total - self.free
        return 0


def test_context_cost_from_nvml_is_read_before_the_context_exists():
    lib = FakeNvml(free=15 << 30)

    def open_session():  # what creating a CUDA session does to the device's free memory
        assert lib.reads == 1, "the 'before' read must come first"
        lib.free -= 612 * MIB
        return object()

    assert gpumem.context_cost(gpumem.Nvml(lib=lib), open_session) == 612 * MIB
    assert gpumem.Nvml(lib=lib).memory() == gpumem.DeviceMemory(lib.free, 16 << 30)


def test_nvml_that_does_not_start_or_lacks_the_device_is_no_reader():
    with pytest.raises(OSError, match="did not initialize"):
        gpumem.Nvml(lib=FakeNvml(free=1, init_rc=9))
    with pytest.raises(OSError, match="no device 1"):
        gpumem.Nvml(lib=FakeNvml(free=1), index=1)


def _meminfo(root: Path, available: int) -> None:
    (root / "proc").mkdir(parents=True, exist_ok=True)
    (root / "proc/meminfo").write_text(f"MemTotal:        7820000 kB\nMemAvailable:    {available // 1024} kB\n")


def test_context_cost_on_shared_dram_from_memavailable(tmp_path):
    _meminfo(tmp_path, 6000 * MIB)

    def open_session():
        _meminfo(tmp_path, 5400 * MIB)
        return object()

    rd = gpumem.SharedDram(tmp_path)
    assert rd.unified and gpumem.context_cost(rd, open_session) == 600 * MIB


def test_reader_on_a_jetson_is_memavailable_and_elsewhere_nvml_or_nothing(tmp_path, monkeypatch):
    rd = gpumem.reader(FAKES / "jetson-orin-nano")  # /etc/nv_tegra_release: one DRAM
    assert isinstance(rd, gpumem.SharedDram) and rd.free() > 0
    monkeypatch.setattr(gpumem, "_load", lambda names, short: None)  # no libnvidia-ml on this host
    assert gpumem.reader(tmp_path) is None
    assert gpumem.why_not(tmp_path).startswith("no NVML (libnvidia-ml")
    monkeypatch.setattr(gpumem, "_load", lambda names, short: FakeNvml(free=8 << 30))
    assert isinstance(gpumem.reader(tmp_path), gpumem.Nvml) and gpumem.reader(tmp_path).free() == 8 << 30


def test_the_context_subcommand_says_why_not_here(monkeypatch, capsys):
    monkeypatch.setattr(gpumem, "_load", lambda names, short: None)
    assert gpumem.main(["context", "--root", "/nonexistent", "--discrete"]) == 0
    assert "no NVML" in json.loads(capsys.readouterr().out)["note"]


def test_measure_context_fresh_runs_in_another_process_and_says_why_not_here():
    if gpumem.reader("/nonexistent", unified=False) is not None:
        pytest.skip("this machine has NVML: tests/bench/test_gpu.py measures the context here")
    m = gpumem.measure_context_fresh("/nonexistent", unified=False)
    assert "context_bytes" not in m and m["note"].startswith("no NVML (libnvidia-ml")


class FakeReader:
    def __init__(self, frees, unified=False):
        self.frees, self.unified, self.name, self.calls = list(frees), unified, "fake", []

    def free(self):
        self.calls.append("free")
        return self.frees.pop(0)


@pytest.mark.parametrize("unified", [False, True])
def test_measure_engine_reads_device_memory_before_the_engine_opens(tiny_bundle, monkeypatch, unified):
    from edgespec.engine import measure

    rd = FakeReader([9000 * MIB, 8200 * MIB], unified=unified)
    monkeypatch.setattr(gpumem, "reader", lambda root="/", unified=None: rd)
    real_open = measure.Engine.open

    def open_(*a, **k):
        rd.calls.append("open")
        return real_open(*a, **k)

    monkeypatch.setattr(measure.Engine, "open", staticmethod(open_))
    out = measure.measure_engine(tiny_bundle, max_len=64, load_draft=False)
    assert rd.calls == ["free", "open", "free"]
    if unified:  # MemAvailable fell by host and device together
        assert out["shared_used_delta"] == 800 * MIB
        assert out["device_used_delta"] == max(0, 800 * MIB - (out["peak"] - out["baseline"]))
    else:
        assert out["device_used_delta"] == 800 * MIB and "shared_used_delta" not in out


# --- the plan: host + device on one DRAM ---------------------------------------------------------
def _both(b, length, profile, **kw):
    return memory.plan(b, max_len=length, want_draft=False, budget_bytes=None, profile=profile, device="cuda", **kw)


def test_on_a_jetson_host_and_device_add_up_and_the_cache_shrinks(tiny_cuda_bundle):
    orin = devices.get("jetson-orin-nano-8gb")
    assert orin.memory_shared_with_gpu
    small, full = _both(tiny_cuda_bundle, 256, orin), _both(tiny_cuda_bundle, 512, orin)
    assert full.unified and full.predicted_bytes == sum(full.breakdown.values()) + full.device_bytes
    assert full.breakdown["target_kv"] == 0 and full.device_breakdown["target_kv"] > 0  # the KV is device memory
    budget = (small.predicted_bytes + full.predicted_bytes) // 2
    assert sum(full.breakdown.values()) < budget  # the host side alone would fit at full length
    p = memory.plan(tiny_cuda_bundle, max_len=512, want_draft=False, budget_bytes=budget, profile=orin, device="cuda")
    assert 256 <= p.max_len < 512 and p.predicted_bytes <= budget
    shrunk = [n for n in p.notes if n.startswith("max_len shrunk")]
    assert len(shrunk) == 1 and "+ device" in shrunk[0] and "one DRAM on this board" in shrunk[0]
    assert "device cuda_context" in p.describe()


def test_on_a_jetson_a_budget_the_host_side_alone_fits_is_refused_with_the_sum(tiny_cuda_bundle):
    orin = devices.get("jetson-orin-nano-8gb")
    small = _both(tiny_cuda_bundle, 256, orin)
    budget = sum(small.breakdown.values()) + 1 * MIB  # host fits, host + device does not
    with pytest.raises(BudgetError) as e:
        memory.plan(tiny_cuda_bundle, max_len=512, want_draft=False, budget_bytes=budget, profile=orin, device="cuda")
    msg = str(e.value)
    assert "\n" not in msg and "device cuda context" in msg and "host and device: one DRAM" in msg


def test_a_discrete_gpu_keeps_host_and_device_apart(tiny_cuda_bundle):
    dgpu = devices.get("generic-x86_64")
    assert not dgpu.memory_shared_with_gpu
    orin = _both(tiny_cuda_bundle, 512, devices.get("jetson-orin-nano-8gb"))
    budget = sum(orin.breakdown.values()) + 1 * MIB  # the same budget that shrinks or refuses on a Jetson
    p = memory.plan(tiny_cuda_bundle, max_len=512, want_draft=False, budget_bytes=budget, profile=dgpu, device="cuda")
    assert p.max_len == 512 and not p.unified
    assert p.predicted_bytes == sum(p.breakdown.values()) and p.device_bytes > 300 * MIB


def test_a_measured_context_replaces_the_estimate(tiny_cuda_bundle):
    orin = devices.get("jetson-orin-nano-8gb")
    est, meas = _both(tiny_cuda_bundle, 256, orin), _both(tiny_cuda_bundle, 256, orin, context_bytes=700 * MIB)
    assert est.device_breakdown["cuda_context"] == memory.CUDA_CONTEXT
    assert meas.device_breakdown["cuda_context"] == 700 * MIB
    assert meas.predicted_bytes - est.predicted_bytes == 700 * MIB - memory.CUDA_CONTEXT


def test_plan_measure_on_a_jetson_measures_the_context_first_and_plans_with_it(tiny_cuda_bundle, monkeypatch, capsys):
    from edgespec.engine import measure

    calls = []
    monkeypatch.setattr(gpumem, "measure_context_fresh", lambda root="/", unified=None, **k: (
        calls.append(("context", unified)) or {"context_bytes": 700 * MIB, "reader": "meminfo", "unified": True}))
    monkeypatch.setattr(measure, "measure_fresh", lambda root, **k: (
        calls.append(("engine", k["max_len"])) or {"peak": 400 * MIB, "baseline": 100 * MIB, "after_load": 300 * MIB,
                                                  "pid": -1, "shared_used_delta": 1200 * MIB,
                                                  "device_used_delta": 900 * MIB, "device_reader": "meminfo"}))
    rc = cli.main(["plan", str(tiny_cuda_bundle), "--max-len", "256", "--device", "jetson-orin-nano-8gb",
                   "--measure", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and calls == [("context", True), ("engine", 256)]
    assert out["device_plan"]["breakdown"]["cuda_context"] == 700 * MIB
    assert out["device_plan"]["estimated"] == ["cublas_workspace"] and out["device_plan"]["counted_in_budget"]
    assert out["cuda_context_measured_bytes"] == 700 * MIB and out["shared_measured_bytes"] == 1200 * MIB
    assert out["measured_peak_bytes"] == 1300 * MIB  # RSS + device: one DRAM
    rc = cli.main(["plan", str(tiny_cuda_bundle), "--max-len", "256", "--device", "jetson-orin-nano-8gb", "--measure"])
    text = capsys.readouterr().out
    assert "CUDA context: measured 700 MiB in a fresh process (meminfo)" in text
    assert "the CUDA context included" in text


def test_plan_for_a_jetson_from_a_copied_tree_counts_the_sum(tiny_cuda_bundle, tmp_path, capsys, monkeypatch):
    """`--root` a Jetson's tree, as a user on the board: detected, unified, its MemTotal; on this
    machine onnxruntime has no CUDA, so 'here' the engine would run on the CPU: no device side."""
    root = tmp_path / "orin"
    shutil.copytree(FAKES / "jetson-orin-nano", root)
    import onnxruntime as ort

    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    rc = cli.main(["plan", str(tiny_cuda_bundle), "--max-len", "256", "--root", str(root), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["device"] == "jetson-orin-nano-8gb" and out["unified"]
    assert out["predicted_bytes"] == sum(out["breakdown"].values()) + out["device_bytes"]
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    rc = cli.main(["plan", str(tiny_cuda_bundle), "--max-len", "256", "--root", str(root), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and not out["unified"] and out["device_bytes"] == 0 and "device_plan" not in out


def test_ctypes_struct_matches_nvml_memory_layout():
    """nvmlMemory_t is three unsigned long longs: total, free, used (nvml.h)."""
    assert ctypes.sizeof(gpumem._NvmlMemory) == 24
    assert [f[0] for f in gpumem._NvmlMemory._fields_] == ["total", "free", "used"]


# --- the CUDA/cuDNN libraries of onnxruntime-gpu's [cuda,cudnn] extras, loaded before a CUDA session --
@pytest.fixture
def fake_preload(monkeypatch):
    import importlib.util

    import onnxruntime as ort

    from edgespec.edge import providers

    calls = []
    monkeypatch.setattr(providers, "_preloaded", False)
    monkeypatch.setattr(ort, "preload_dlls", lambda *a, **k: calls.append("preload"), raising=False)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "nvidia" else real(name, *a))
    return calls


def test_preload_runs_once_per_process_where_the_nvidia_wheels_are(fake_preload):
    from edgespec.edge import providers

    assert providers.preload_cuda_libraries().endswith("preload_dlls() done")
    assert providers.preload_cuda_libraries() == "already preloaded"
    assert fake_preload == ["preload"]


def test_preload_is_skipped_without_the_nvidia_wheels(monkeypatch):
    import importlib.util

    import onnxruntime as ort

    from edgespec.edge import providers

    calls = []
    monkeypatch.setattr(providers, "_preloaded", False)
    monkeypatch.setattr(ort, "preload_dlls", lambda *a, **k: calls.append("preload"), raising=False)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "nvidia" else real(name, *a))
    assert "no nvidia-* wheels" in providers.preload_cuda_libraries() and calls == []


def test_a_cuda_session_preloads_and_a_cpu_one_does_not(fake_preload, monkeypatch):
    """create_session preloads before trying CUDA (here CUDA is faked into the list: onnxruntime then
    falls back to the CPU, which the order allows), and not at all for a CPU-only order."""
    import onnxruntime as ort

    from edgespec.edge import providers

    model = providers.probe_model_bytes()
    providers.create_session(model, providers="cpu")
    assert fake_preload == []
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setattr(ort, "InferenceSession", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("no CUDA here")))
    with pytest.raises(Exception, match="no CUDA here"):
        providers.create_session(model, providers="cuda")
    assert fake_preload == ["preload"]


def test_the_probe_session_feeds_every_input_of_the_probe_graph():
    """The probe graph has two inputs (X, W); a feed of X alone fails on every provider (seen on a GPU)."""
    from edgespec.edge.gpumem import cuda_probe_session
    from edgespec.edge.providers import CPU

    sess = cuda_probe_session(CPU)
    assert sorted(i.name for i in sess.get_inputs()) == ["W", "X"]
