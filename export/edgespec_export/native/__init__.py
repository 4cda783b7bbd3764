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
