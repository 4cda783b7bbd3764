"""edgespec: speculative decoding for LLMs on edge devices, on onnxruntime."""
__version__ = "0.1.0"

__all__ = ["Engine", "GenerationResult", "GenerationStats", "__version__"]

# Importing edgespec never needs onnxruntime (`edgespec doctor` must run without one): the check and its one line
# live in the leaf `errors`, where the engine's builder and the export command reach them without importing this
# package's lazy attributes (no import cycle).
from .errors import MISSING_ONNXRUNTIME, onnxruntime_missing, require_onnxruntime  # noqa: E402,F401


def __getattr__(name: str):
    # Lazy, so that `edgespec --help` and modules that only need the version do not import numpy.
    if name in ("Engine", "GenerationResult", "GenerationStats", "Stream"):
        from . import engine

        return getattr(engine, name)
    raise AttributeError(f"module 'edgespec' has no attribute {name!r}")
