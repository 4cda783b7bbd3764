"""edgespec: speculative decoding for LLMs on edge devices, on onnxruntime."""
__version__ = "0.1.0"

__all__ = ["Engine", "GenerationResult", "GenerationStats", "__version__"]


def __getattr__(name: str):
    # Lazy, so that `edgespec --help` and modules that only need the version do not import numpy.
    if name in ("Engine", "GenerationResult", "GenerationStats", "Stream"):
        from . import engine

        return getattr(engine, name)
    raise AttributeError(f"module 'edgespec' has no attribute {name!r}")
