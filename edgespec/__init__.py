"""edgespec: speculative decoding for LLMs on edge devices, on onnxruntime."""
import importlib.util as _util

__version__ = "0.1.0"

__all__ = ["Engine", "GenerationResult", "GenerationStats", "__version__"]

# The runtime's requirements pull no onnxruntime (pyproject.toml): the CPU wheel comes with the `cpu` extra, and a
# Jetson's onnxruntime-gpu is NVIDIA's. Without either, say which to install before anything fails deeper down.
# A spec without an origin is a leftover `onnxruntime/` folder (two onnxruntime wheels installed, one removed).
MISSING_ONNXRUNTIME = (
    "edgespec needs onnxruntime and none is importable here: pip install 'edgespec[cpu]' for the CPU one, or on a "
    "Jetson NVIDIA's onnxruntime-gpu for your JetPack (docs/jetson.md); a leftover onnxruntime folder needs "
    "`pip install --force-reinstall` of the one you keep")
try:
    _spec = _util.find_spec("onnxruntime")
except (ImportError, ValueError):  # a finder that refuses it, or a None left in sys.modules
    _spec = None
if _spec is None or _spec.origin is None:
    raise ImportError(MISSING_ONNXRUNTIME)


def __getattr__(name: str):
    # Lazy, so that `edgespec --help` and modules that only need the version do not import numpy.
    if name in ("Engine", "GenerationResult", "GenerationStats", "Stream"):
        from . import engine

        return getattr(engine, name)
    raise AttributeError(f"module 'edgespec' has no attribute {name!r}")
