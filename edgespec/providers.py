"""Execution providers: which onnxruntime backend runs a model, tried for real, in order.

A provider listed by `get_available_providers()` can still fail to create a session (missing CUDA
libraries, a TensorRT that rejects an op), so each is tried with the real model and the next one
is used on failure, with one log line saying why.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

from .errors import ProviderError

log = logging.getLogger("edgespec.providers")

DEFAULT_ORDER = ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider")
SHORT_NAMES = {"tensorrt": "TensorrtExecutionProvider", "trt": "TensorrtExecutionProvider",
               "cuda": "CUDAExecutionProvider", "cpu": "CPUExecutionProvider"}


def normalize(names) -> list[str]:
    """Accepts "cuda,cpu", ["cuda", "CPUExecutionProvider"], ... and returns full provider names."""
    if names is None:
        return list(DEFAULT_ORDER)
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    return [SHORT_NAMES.get(n.lower(), n) for n in names]


def device_of(provider: str) -> str:
    """Where the KV cache should live for this provider (OrtValue device name)."""
    return "cuda" if provider in ("CUDAExecutionProvider", "TensorrtExecutionProvider") else "cpu"


def session_options(threads: int | None = None):
    import onnxruntime as ort

    so = ort.SessionOptions()
    if threads:
        so.intra_op_num_threads = int(threads)
        so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    return so


def create_session(path: str | os.PathLike, *, providers=None, threads: int | None = None, provider_options=None):
    """Returns (session, device). Tries each requested provider that this onnxruntime has."""
    import onnxruntime as ort

    available = set(ort.get_available_providers())
    errors = []
    for name in normalize(providers):
        if name not in available:
            errors.append(f"{name}: not in this onnxruntime build")
            continue
        opts = (provider_options or {}).get(name, {})
        try:
            sess = ort.InferenceSession(str(Path(path)), session_options(threads), providers=[(name, opts)])
        except Exception as e:  # onnxruntime raises plain RuntimeError/Fail for all of these
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            log.warning("provider %s failed for %s (%s); trying the next one", name, Path(path).name, msg)
            errors.append(f"{name}: {msg}")
            continue
        return sess, device_of(name)
    raise ProviderError(f"no execution provider could run {path}: " + "; ".join(errors))
