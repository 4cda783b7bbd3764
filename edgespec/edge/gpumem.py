"""Device memory, measured: CUDA's own free/total (cudaMemGetInfo through ctypes), else nothing.

Why not RSS: CUDA allocations (weights copied to the device, the KV cache, the arena, cuBLAS
workspaces, TensorRT engines) do not show in a process's RSS, on a discrete GPU or on a Jetson,
where they come out of the same DRAM. So `plan --measure` reads the device's free memory before
and after loading, in the measuring process. On a Jetson, cudaMemGetInfo reports the shared DRAM
the GPU may use (its "free" follows MemAvailable), so the same delta works there; `tegra_available`
reads MemAvailable for a second opinion.

No GPU (or no CUDA runtime library): `device_memory()` returns None and callers say they cannot
measure, rather than print a zero.
"""
from __future__ import annotations

import ctypes
import ctypes.util
from dataclasses import dataclass
from pathlib import Path

_LIBS = ("libcudart.so", "libcudart.so.12", "libcudart.so.13", "libcudart.so.11.0")


@dataclass(frozen=True)
class DeviceMemory:
    free: int  # bytes
    total: int

    @property
    def used(self) -> int:
        return self.total - self.free


def _cudart():
    names = list(_LIBS)
    found = ctypes.util.find_library("cudart")
    if found:
        names.insert(0, found)
    for n in names:
        try:
            return ctypes.CDLL(n)
        except OSError:
            continue
    # onnxruntime-gpu wheels from PyPI bring the CUDA runtime as nvidia-cuda-runtime-cu12
    try:
        import nvidia.cuda_runtime  # type: ignore

        for lib in sorted(Path(list(nvidia.cuda_runtime.__path__)[0], "lib").glob("libcudart.so*")):
            try:
                return ctypes.CDLL(str(lib))
            except OSError:
                continue
    except ImportError:
        pass
    return None


def device_memory(device_id: int = 0) -> DeviceMemory | None:
    """Free and total memory of CUDA device `device_id`, or None where there is none."""
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


def why_not() -> str:
    """One line for `plan --measure` where device memory cannot be measured."""
    if _cudart() is None:
        return "no CUDA runtime (libcudart) on this machine: device memory cannot be measured here"
    return "the CUDA runtime found no usable device: device memory cannot be measured here"


def is_tegra(root: str | Path = "/") -> bool:
    """A Jetson (its GPU shares the DRAM): /etc/nv_tegra_release or a tegra compatible string."""
    root = Path(root)
    if (root / "etc/nv_tegra_release").exists():
        return True
    try:
        return b"tegra" in (root / "proc/device-tree/compatible").read_bytes()
    except OSError:
        return False
