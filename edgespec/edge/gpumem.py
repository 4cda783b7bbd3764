"""Device memory, measured honestly: read before the CUDA context exists, so the context is counted.

Why not RSS: CUDA allocations (weights copied to the device, the KV cache, the arena, cuBLAS
workspaces) do not show in a process's RSS, on a discrete GPU or on a Jetson, where they come out of
the same DRAM.

Why not cudaMemGetInfo alone: asking the CUDA runtime anything creates its context first, so a
"before" read through it already has the context (hundreds of MB on a Jetson) taken, and the
context could never appear in a measurement. The "before" read must come from outside CUDA:

- `Nvml`: NVIDIA's management library (libnvidia-ml, through ctypes; it ships with the driver),
  which reads the device's free memory without creating a context. A discrete GPU.
- `SharedDram`: on a board whose GPU shares the DRAM (every Jetson: `memory_shared_with_gpu` in its
  profile, or /etc/nv_tegra_release), what CUDA takes is taken from the kernel's MemAvailable
  (<root>/proc/meminfo), together with what the process itself takes: the sum the board's memory
  budget is about.

`context_cost` reads one of them, opens a CUDA session on a one-node graph, and reads again: the
context's own cost (plus onnxruntime's CUDA kernels and a tiny arena). Run it in a fresh process
(`python -m edgespec.edge.gpumem context`, `measure_context_fresh`): a process that already has a
context would measure nothing. No GPU: `reader()` is None and callers say they cannot measure,
rather than print a zero. `device_memory` (cudaMemGetInfo) stays for reads after the context exists.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

from .memcheck import meminfo

_LIBS = ("libcudart.so", "libcudart.so.12", "libcudart.so.13", "libcudart.so.11.0")
_NVML_LIBS = ("libnvidia-ml.so.1", "libnvidia-ml.so")


@dataclass(frozen=True)
class DeviceMemory:
    free: int  # bytes
    total: int

    @property
    def used(self) -> int:
        return self.total - self.free


class FreeReader(Protocol):
    """Free device memory in bytes, read without creating a CUDA context (None: cannot read now)."""

    name: str
    unified: bool  # the reading includes what the host side takes too (one DRAM)

    def free(self) -> int | None: ...


class _NvmlMemory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class Nvml:
    """Device `index`'s free memory from NVML (no CUDA context). `lib`: a loaded libnvidia-ml (tests
    pass a fake with the same three functions)."""

    name = "nvml"
    unified = False

    def __init__(self, lib=None, index: int = 0):
        self.lib = lib if lib is not None else _load(_NVML_LIBS, "nvidia-ml")
        if self.lib is None:
            raise OSError("no NVML (libnvidia-ml.so.1, installed with the NVIDIA driver)")
        if self.lib.nvmlInit_v2() != 0:
            raise OSError("NVML did not initialize (no NVIDIA driver loaded?)")
        self.handle = ctypes.c_void_p()
        if self.lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(self.handle)) != 0:
            raise OSError(f"NVML has no device {index}")

    def memory(self) -> DeviceMemory | None:
        m = _NvmlMemory()
        if self.lib.nvmlDeviceGetMemoryInfo(self.handle, ctypes.byref(m)) != 0:
            return None
        return DeviceMemory(int(m.free), int(m.total))

    def free(self) -> int | None:
        m = self.memory()
        return None if m is None else m.free


class SharedDram:
    """MemAvailable of <root>/proc/meminfo: on a Jetson, CUDA's allocations and the host's come out of it."""

    name = "meminfo"
    unified = True

    def __init__(self, root: str | os.PathLike = "/"):
        self.root = root

    def free(self) -> int | None:
        return meminfo(self.root).get("MemAvailable")


def reader(root: str | os.PathLike = "/", *, unified: bool | None = None) -> FreeReader | None:
    """The reader for this machine: SharedDram on a unified-memory board (`unified`, else a Jetson
    detected under `root`), else NVML where the driver has it, else None."""
    if unified if unified is not None else is_tegra(root):
        return SharedDram(root)
    try:
        return Nvml()
    except OSError:
        return None


def context_cost(read: FreeReader, open_session: Callable[[], object]) -> int | None:
    """Free memory before and after `open_session()` (which creates the CUDA context): its cost in
    bytes, or None where the reader could not read. The session is held until the second read."""
    before = read.free()
    session = open_session()
    after = read.free()
    del session
    if before is None or after is None:
        return None
    return max(0, before - after)


def cuda_probe_session(provider: str | None = None):
    """A CUDA session on a one-node graph (providers.probe_model_bytes), run once: the context, the
    provider's kernels and its arena exist after this. Raises if the session is not on `provider`
    (CUDA; the tests pass the CPU provider to run the same feed where no GPU is)."""
    import numpy as np
    import onnxruntime as ort

    from .providers import CUDA, preload_cuda_libraries, probe_model_bytes, session_options

    provider = provider or CUDA
    preload_cuda_libraries()
    sess = ort.InferenceSession(probe_model_bytes(), session_options(1), providers=[provider])
    if sess.get_providers()[0] != provider:
        raise RuntimeError(f"onnxruntime gave {sess.get_providers()[0]}, not {provider}")
    # the probe graph is Y = MatMul(X [1, 8], W [8, 8]): every input is fed (feeding X alone was refused)
    sess.run(None, {"X": np.ones((1, 8), np.float32), "W": np.eye(8, dtype=np.float32)})
    return sess


def measure_context_fresh(root: str | os.PathLike = "/", *, unified: bool | None = None,
                          timeout: float = 300) -> dict:
    """`context_cost` in a new Python process: {"context_bytes", "reader"} or {"note": why not}."""
    argv = [sys.executable, "-m", "edgespec.edge.gpumem", "context", "--root", str(root)]
    if unified is not None:
        argv.append("--unified" if unified else "--discrete")
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    lines = p.stdout.strip().splitlines()
    if p.returncode != 0 or not lines:
        return {"note": f"measuring the CUDA context failed ({p.returncode}): {p.stderr.strip()[-500:]}"}
    return json.loads(lines[-1])


def _load(names, short: str):
    found = ctypes.util.find_library(short)
    for n in ([found] if found else []) + list(names):
        try:
            return ctypes.CDLL(n)
        except OSError:
            continue
    return None


def _cudart():
    lib = _load(_LIBS, "cudart")
    if lib is not None:
        return lib
    try:  # onnxruntime-gpu's [cuda] extra brings the CUDA runtime as a wheel (nvidia-cuda-runtime)
        import nvidia.cuda_runtime  # type: ignore

        libs = sorted(Path(list(nvidia.cuda_runtime.__path__)[0], "lib").glob("libcudart.so*"))
        return _load([str(p) for p in libs], "-")
    except ImportError:
        return None


def device_memory(device_id: int = 0) -> DeviceMemory | None:
    """Free and total memory of CUDA device `device_id` (cudaMemGetInfo: creates the context if there
    is none yet, so only for reads after it exists), or None where there is none."""
    lib = _cudart()
    if lib is None:
        return None
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    try:
        if lib.cudaSetDevice(int(device_id)) != 0:
            return None
        if lib.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total)) != 0:
            return None
    except AttributeError:
        return None
    return DeviceMemory(int(free.value), int(total.value))


def why_not(root: str | os.PathLike = "/") -> str:
    """One line for `plan --measure` where device memory cannot be measured."""
    if reader(root) is None:
        return ("no NVML (libnvidia-ml, from the NVIDIA driver) and not a Jetson: device memory cannot be "
                "measured here")
    return "device memory could not be read here"


def is_tegra(root: str | Path = "/") -> bool:
    """A Jetson (its GPU shares the DRAM): /etc/nv_tegra_release or a tegra compatible string."""
    root = Path(root)
    if (root / "etc/nv_tegra_release").exists():
        return True
    try:
        return b"tegra" in (root / "proc/device-tree/compatible").read_bytes()
    except OSError:
        return False


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m edgespec.edge.gpumem")
    ap.add_argument("what", choices=["context"])
    ap.add_argument("--root", default="/")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--unified", dest="unified", action="store_true", default=None)
    g.add_argument("--discrete", dest="unified", action="store_false")
    a = ap.parse_args(argv)
    import onnxruntime  # noqa: F401  (imported before the first read: its host memory is not the context's)

    rd = reader(a.root, unified=a.unified)
    if rd is None:
        print(json.dumps({"note": why_not(a.root)}))
        return 0
    try:
        cost = context_cost(rd, cuda_probe_session)
    except Exception as e:  # no CUDA provider, no libraries: say why, as one line
        print(json.dumps({"note": f"no CUDA session could be created: {str(e).splitlines()[0] if str(e) else type(e).__name__}"}))
        return 0
    print(json.dumps({"context_bytes": cost, "reader": rd.name, "unified": rd.unified}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
