"""edgespec: speculative decoding for LLMs on edge devices, on onnxruntime."""
__version__ = "0.1.0"

__all__ = ["Engine", "GenerationResult", "GenerationStats", "__version__"]

# The runtime's requirements pull no onnxruntime (pyproject.toml): the CPU wheel comes with the `cpu` extra, and a
# Jetson's onnxruntime-gpu is NVIDIA's. Importing edgespec never needs it (`edgespec doctor` must run on an install
# without one, to say which to add); opening an engine does, and raises this one line when none is importable.
MISSING_ONNXRUNTIME = (
    "edgespec needs onnxruntime and none is importable here: pip install 'edgespec[cpu]' for the CPU one, or on a "
    "Jetson NVIDIA's onnxruntime-gpu for your JetPack (docs/jetson.md); a leftover onnxruntime folder needs "
    "`pip install --force-reinstall` of the one you keep")


def onnxruntime_missing() -> bool:
    """True when no onnxruntime is importable. A spec without an origin is a leftover `onnxruntime/` folder (two
    onnxruntime wheels installed, one removed): as good as none."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("onnxruntime")
    except (ImportError, ValueError):  # a finder that refuses it, or a None left in sys.modules
        spec = None
    return spec is None or spec.origin is None


def require_onnxruntime() -> None:
    """Raise `errors.OnnxruntimeMissing` (an ImportError and an EdgespecError: the CLI prints it as one line) when
    no onnxruntime is importable; called where an engine or a session is about to be opened."""
    if onnxruntime_missing():
        from .errors import OnnxruntimeMissing

        raise OnnxruntimeMissing(MISSING_ONNXRUNTIME)


def __getattr__(name: str):
    # Lazy, so that `edgespec --help` and modules that only need the version do not import numpy.
    if name in ("Engine", "GenerationResult", "GenerationStats", "Stream"):
        from . import engine

        return getattr(engine, name)
    raise AttributeError(f"module 'edgespec' has no attribute {name!r}")
