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

`planned` and `open_session` are the one choice every path makes: the engine's runners (at every
`--parallel`), the memory plan and `edgespec plan` (which count the graph the
engine will load), `plan --measure` (an engine opened the same way). The rest are pure functions over
names, so tests fake the provider list without a GPU.
"""
from __future__ import annotations

import ctypes
import os
import platform
from pathlib import Path
from typing import Callable, Iterable

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


def planned(facts: ModelFacts, providers=None, available: Iterable[str] | None = None) -> ModelFacts:
    """The graph an engine will load for this provider order (before any session exists): what the
    memory plan counts and `edgespec plan` shows. `available`: this onnxruntime's providers."""
    from .providers import normalize

    if available is None:
        import onnxruntime as ort

        available = ort.get_available_providers()
    return choose(facts, first_usable(normalize(providers), available))


def open_session(facts: ModelFacts, path: Path, providers, create: Callable, *, force: bool | None = None):
    """Opens the graph of the flavor the provider runs, and refuses what `check` refuses. Returns
    (graph facts, session, device).

    `path`: the model's graph in its bundle (root / facts.path); a graph outside a bundle is opened as is.
    `create(path, providers, graph_flavor) -> (session, device)` makes the session (edge/providers.create_session
    with the caller's threads and pools). With a cpu and a cuda graph, the cuda one is tried when CUDA
    comes first in the order; when that session ends up on the CPU anyway (the GPU provider failed),
    the cpu graph is loaded instead."""
    from .providers import CPU

    root = _bundle_root(Path(path), facts)
    graphs = facts.graphs() if root is not None else {facts.graph_flavor(): facts}
    chosen = planned(facts, providers) if root is not None else facts
    session, device = create(root / chosen.path if root is not None else Path(path), providers,
                             chosen.graph_flavor())
    got = flavor_for_device(device)
    if got != chosen.graph_flavor() and got in graphs:
        chosen = graphs[got]
        session, device = create(root / chosen.path, [CPU], got)
    check(chosen, device, force=force)
    return chosen, session, device


def _bundle_root(path: Path, facts: ModelFacts) -> Path | None:
    """The bundle folder `path` (= root / facts.path) is in, or None for a graph outside a bundle."""
    rel = Path(facts.path).parts
    if len(path.parts) > len(rel) and path.parts[-len(rel):] == rel:
        return path.parents[len(rel) - 1]
    return None
