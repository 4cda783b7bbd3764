"""Every error a user can cause has its own class, so the CLI, the Python API and the HTTP server can
each turn it into the right message or status code without parsing strings."""
from __future__ import annotations


class EdgespecError(Exception):
    """Base class: anything edgespec raises on purpose."""


class OnnxruntimeMissing(EdgespecError, ImportError):
    """No onnxruntime is importable: raised where an engine is opened, never at `import edgespec`."""


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
        raise OnnxruntimeMissing(MISSING_ONNXRUNTIME)


# --- bundles -------------------------------------------------------------------------------------
class BundleError(EdgespecError):
    """The bundle cannot be trusted or used: missing files, bad checksums, bad manifest."""


class BundleNotFound(BundleError):
    pass


class BundleCorrupt(BundleError):
    """A checksum, size or schema check failed. `problems` lists each one, one line each."""

    def __init__(self, path: str, problems: list[str]):
        self.path = path
        self.problems = list(problems)
        lines = "\n  ".join(self.problems)
        super().__init__(f"bundle {path} failed verification ({len(self.problems)} problem(s)):\n  {lines}")


class TokenizerMismatch(EdgespecError):
    """Target and draft do not map the same tokens to the same ids."""


# --- requests (all are ValueErrors so that plain Python callers can catch them as such) ----------
class InvalidRequest(EdgespecError, ValueError):
    """A request parameter is out of range; the server answers 400."""

    param: str | None = None

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class PromptTooLong(InvalidRequest):
    def __init__(self, prompt_tokens: int, max_new_tokens: int, capacity: int):
        self.prompt_tokens = prompt_tokens
        self.capacity = capacity
        super().__init__(
            f"prompt is {prompt_tokens} tokens but the cache holds {capacity} "
            f"(prompt + at least 1 new token must fit; open the engine with a larger max_len "
            f"or shorten the prompt)",
            param="prompt",
        )


class DraftUnavailable(InvalidRequest):
    """`draft="model"` on a bundle without a draft model (or one dropped by the memory plan)."""


# --- resources -----------------------------------------------------------------------------------
class BudgetError(EdgespecError):
    """A memory or power budget cannot be met; the message carries the numbers."""


class ProviderError(EdgespecError):
    """No execution provider could create a session."""


class OnnxruntimeTooOld(ProviderError):
    """The installed onnxruntime predates the floor of the graph's flavor (edgespec.models.kernels.ORT_FLOORS);
    the message names the fix."""


class ExportError(EdgespecError):
    """The workstation export failed for a reason the user can fix (bad source, no network, ...)."""


class ModelFetchError(EdgespecError):
    """`edgespec pull` could not get a model from any of its sources."""
