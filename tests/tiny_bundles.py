"""Builds the tiny test bundles through the real export path.

    python tests/tiny_bundles.py DIR [NAME...]   # prebuild (e.g. on x86_64, for the arm64 run without torch)

Tests get them from the fixtures in conftest.py; with EDGESPEC_TEST_BUNDLES=DIR set they are read
from DIR instead of being built (the export extra, torch included, is then not needed).
"""
from __future__ import annotations

import sys
from pathlib import Path

# name -> (target arch, draft: None | noise level relative to the target's weights, quant[, flavors[, layers]])
VARIANTS = {
    "qwen-agree": ("qwen2", 0.05, "fp32"),  # a draft that agrees often
    "qwen-disagree": ("qwen2", 2.0, "fp32"),  # a draft that disagrees often
    "qwen-nodraft": ("qwen2", None, "fp32"),
    "llama-agree": ("llama", 0.05, "fp32"),
    # the cuda flavor alone (float16 activations, GroupQueryAttention and KV cache, 8-bit MatMulNBits
    # with float16 scales), so the CPU provider runs it: the Jetson's graphs, tested without a GPU
    "qwen-cuda-agree": ("qwen2", 0.05, "int8", ("cuda",)),
    "qwen-cuda-disagree": ("qwen2", 2.0, "int8", ("cuda",)),
    # both flavors in one bundle (model.onnx + model.cuda.onnx): the runtime's choice between them
    "qwen-both": ("qwen2", 0.05, "int8", ("cpu", "cuda")),
    "qwen-deep": ("qwen2", None, "fp32", ("cpu",), 6),  # 6 layers, no draft: self-speculative drafting
    "qwen-pruned": ("qwen2", 0.05, "fp32"),  # qwen-agree with the draft's lm_head pruned (DRAFT_VOCAB)
    # int8/int4 MatMulNBits (accuracy level 4) on the cpu flavor: deterministic mode's kernels
    "qwen-int8": ("qwen2", 0.05, "int8"),
    "qwen-int4": ("qwen2", 0.05, "int4"),
    "qwen-heads": ("qwen2", None, "fp32"),  # Medusa heads trained at export (HEADS), no draft model
    "qwen-cuda-heads": ("qwen2", None, "int8", ("cuda",)),  # the same over an 8-bit float16 target
    "qwen-feature": ("qwen2", None, "fp32"),  # the feature drafter trained at export (HEADS), no draft model
}
# export options per variant: a random 64-wide model at int4 agrees with float on ~82 % of tokens
EXPORT_OPTIONS = {"qwen-int4": {"min_top1": 0.7, "draft_min_top1": 0.7}}
DRAFT_VOCAB = {"qwen-pruned": 200}  # export --draft-vocab, per variant (of 400 usable ids)
SELF_DRAFT = {"qwen-deep", "qwen-nodraft"}  # export --self-draft: the layer search, for draft="self"
# export --heads medusa, the fast path: a few hundred tokens, a few dozen steps, a pruned head
HEADS = {name: dict(tokens=600, steps=40, answers=2, vocab=200) for name in ("qwen-heads", "qwen-cuda-heads")}
HEADS["qwen-feature"] = dict(method="feature", tokens=600, steps=40, answers=2, vocab=200, ffn=32)


def build(name: str, root: Path) -> Path:
    from edgespec_export.heads import HeadsOptions
    from edgespec_export.pipeline import export_bundle
    from edgespec_export.tiny import make_tiny_draft, make_tiny_model

    arch, noise, quant, *rest = VARIANTS[name]
    eps = rest[0] if rest else ("cpu",)
    out = root / name
    if (out / "manifest.json").exists():
        return out
    src = root / "src" / name
    target = make_tiny_model(src / "target", arch=arch, seed=0, layers=rest[1] if len(rest) > 1 else 2)
    draft = make_tiny_draft(target, src / "draft", noise=noise) if noise is not None else None
    # in-process (no child per model): these models are tiny and the fixtures must be quick
    return export_bundle(target, out, draft=draft, quant=quant, isolate=False, eps=eps,
                         draft_vocab=DRAFT_VOCAB.get(name, 0), self_draft=name in SELF_DRAFT,
                         **EXPORT_OPTIONS.get(name, {}), heads=HeadsOptions(**HEADS[name]) if name in HEADS else None)


def build_all(root: Path) -> dict[str, Path]:
    root.mkdir(parents=True, exist_ok=True)
    return {name: build(name, root) for name in VARIANTS}


if __name__ == "__main__":  # tiny_bundles.py DIR [NAME...]: every variant, or the ones named
    names = sys.argv[2:]
    Path(sys.argv[1]).mkdir(parents=True, exist_ok=True)
    built = {n: build(n, Path(sys.argv[1])) for n in names} if names else build_all(Path(sys.argv[1]))
    for name, path in built.items():
        print(name, path)
