"""Which graph of a bundle a provider runs: the flavor that matches it (docs/export.md, "Flavors").

A bundle may hold a model in two flavors (`export --ep cpu,cuda`): "cpu" (float32 activations and KV
cache) and "cuda" (float16 activations, GroupQueryAttention and KV cache). onnxruntime's CUDA
GroupQueryAttention is registered for float16/bfloat16 only, so a cpu-flavored graph on the CUDA
provider runs every layer's attention on the CPU, with the whole KV buffer copied between devices
at each step: it works, slowly, and nothing says why. So that case is refused with one line naming
the fix, unless forced (`force=True`, or EDGESPEC_FORCE_FLAVOR=1 in the environment). The other
mismatch, a cuda-flavored graph on the CPU provider, is allowed where the CPU can: the CPU provider
runs float16 GroupQueryAttention and MatMulNBits (slower than float32 on most CPUs), which is how this
flavor is tested on machines without a GPU. An ARM core without the ARMv8.2 half-precision
instructions (a Raspberry Pi 4's Cortex-A72) cannot: onnxruntime's float16 kernels die there with an
illegal instruction, so that case is refused with one line instead.

Pure functions over names, so tests fake the provider list without a GPU.
"""
from __future__ import annotations

import ctypes
import os
import platform
from typing import Iterable

from ..errors import ProviderError
from ..models.manifest import ModelFacts

FORCE_ENV = "EDGESPEC_FORCE_FLAVOR"
_GPU_PROVIDERS = {"CUDAExecutionProvider": "cuda", "TensorrtExecutionProvider": "cuda"}
_AT_HWCAP = 16
_HWCAP_ASIMDHP = 1 << 10  # aarch64: half-precision SIMD arithmetic (ARMv8.2 FP16)


def cpu_runs_float16(machine: str | None = None, hwcap: int | None = None) -> bool:
    """Whether the CPU provider can run float16 kernels here: always on x86_64 (onnxruntime converts),
    on aarch64 only with ARMv8.2 FP16 (the kernel's HWCAP, as onnxruntime itself decides)."""
    machine = machine or platform.machine()
    if machine not in ("aarch64", "arm64"):
        return True
    if hwcap is None:
        try:
            libc = ctypes.CDLL(None)
            libc.getauxval.restype = ctypes.c_ulong
            hwcap = int(libc.getauxval(ctypes.c_ulong(_AT_HWCAP)))
        except (OSError, AttributeError):
            return False  # cannot tell: refusing is a clear line, guessing wrong is a crash
    return bool(hwcap & _HWCAP_ASIMDHP)


def flavor_for_provider(provider: str) -> str:
    """The graph flavor a provider runs natively: "cuda" for CUDA and TensorRT, else "cpu"."""
    return _GPU_PROVIDERS.get(provider, "cpu")


def flavor_for_device(device: str) -> str:
    """Same, from the runner's device ("cuda" | "cpu", providers.device_of)."""
    return "cuda" if device == "cuda" else "cpu"


def first_usable(order: Iterable[str], available: Iterable[str]) -> str | None:
    """The provider a session will try first: the first of `order` this onnxruntime has."""
    have = set(available)
    return next((p for p in order if p in have), None)


def choose(facts: ModelFacts, provider: str | None) -> ModelFacts:
    """The graph to load for `provider`: the bundle's graph of the matching flavor if it has one,
    else its primary graph (whose flavor `check` then judges against the provider really got)."""
    graphs = facts.graphs()
    want = flavor_for_provider(provider) if provider else "cpu"
    return graphs.get(want, facts)


def forced(force: bool | None = None) -> bool:
    if force is not None:
        return bool(force)
    return os.environ.get(FORCE_ENV, "").strip().lower() in ("1", "true", "yes")


def check(facts: ModelFacts, device: str, *, force: bool | None = None) -> None:
    """Raises ProviderError (one line, naming the fix) for a cpu-flavored graph on a CUDA session, and
    for a cuda-flavored graph on a CPU without float16 arithmetic (not forceable: it would crash)."""
    flavor = facts.graph_flavor()
    if flavor_for_device(device) == "cpu" and flavor == "cuda" and not cpu_runs_float16():
        raise ProviderError(
            f"{facts.path} is the cuda flavor (float16 arithmetic), which this CPU cannot run (no ARMv8.2 "
            f"half-precision instructions, e.g. a Raspberry Pi 4): use a bundle exported with --ep cpu "
            f"(or --ep cpu,cuda, which holds both)")
    if flavor_for_device(device) == "cuda" and flavor == "cpu" and not forced(force):
        raise ProviderError(
            f"{facts.path} is the cpu flavor (float32 attention and KV cache), which the CUDA provider cannot "
            f"run on the GPU: re-export with `edgespec export ... --ep cuda` (or --ep cpu,cuda), run with "
            f"--providers cpu, or set {FORCE_ENV}=1 to run it anyway with its attention on the CPU")
