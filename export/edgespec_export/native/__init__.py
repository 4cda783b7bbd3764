"""The native exporter: a GGUF file -> the runtime's graph contract, without torch (docs/export.md,
"From a GGUF file"). gguf_model.py reads the file, blocks.py maps its block types to onnxruntime's,
plan.py decides each tensor's form, graph.py/model.py write the graph node by node with its weights
streamed to the external-data file, reference.py is the numpy forward pass parity compares against,
job.py runs one model as the pipeline's model job."""
from __future__ import annotations

from edgespec.errors import ExportError


def via_for(src, via: str) -> str:
    """The exporter a source goes through: "native" (GGUF, no torch) or "torch" (the builder)."""
    if via == "auto":
        via = "native" if src.kind == "gguf" else "torch"
    elif via == "native" and src.kind != "gguf":
        raise ExportError(f"{src.role} source {src.spec}: --via native reads .gguf files only; a Hugging Face "
                          "folder or hub id goes through the torch builder (--via torch, the default for them)")
    if via == "native":
        from .gguf_model import ARCHS, UnsupportedGGUF

        arch = src.gguf.get("general.architecture")
        if arch not in ARCHS:
            raise UnsupportedGGUF(f"{src.role} source {src.spec}: GGUF architecture {arch!r} is not supported by "
                                  f"the native exporter, which builds {', '.join(ARCHS)} (Qwen2.5, SmolLM2, Llama "
                                  "3.x); --via torch exports it with the builder (needs the torch extra)")
    return via


# The parity text's default length when every model is exported natively: the reference is a numpy forward
# pass (about a minute and a half for the 1.5B at 512 tokens on a loaded 2-core CPU) and the [tokens, vocabulary]
# log-probabilities are held twice; 256 tokens halve both, and a few hundred tokens tell a carried-over GGUF
# (top-1 ~0.99) from a re-rounded one (~0.94). The builder path keeps 512.
NATIVE_PARITY_TOKENS = 256
PARITY_TOKENS = 512


def parity_length(asked: int | None, vias: dict[str, str]) -> int:
    if asked is not None:
        return asked
    return NATIVE_PARITY_TOKENS if all(v == "native" for v in vias.values()) else PARITY_TOKENS
