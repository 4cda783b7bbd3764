"""`edgespec export`: target (+ draft) -> a verified int4/int8/fp16/fp32 ONNX bundle.

Lives in the export half (the `edgespec-export` distribution under export/), which registers it with
the runtime's CLI through the `edgespec.commands` entry point: the device runtime never imports it.
torch, transformers and onnxruntime-genai are imported only when the command runs.
"""
from __future__ import annotations

import argparse
import json
import sys

from edgespec import flags
from edgespec.limits import QUANTS


def register(sub) -> None:
    p = sub.add_parser(
        "export",
        help="turn a target (+ draft) model into a bundle the runtime loads",
        description="Export a target model, and optionally a draft model, into one verified ONNX bundle "
        "(GroupQueryAttention with an in-place KV cache, int4/int8 weights, a parity report). A source is a "
        "Hugging Face folder, a .gguf file, or a hub id (needs network).",
    )
    p.add_argument("source", nargs="?", metavar="TARGET", help="the target model (or use --target)")
    p.add_argument("--target", dest="target_opt", metavar="SRC", help="the target model: HF folder, .gguf file or hub id")
    p.add_argument("--draft-model", metavar="SRC", help="a smaller draft model with the same tokenizer (optional: "
                   "without one the runtime drafts with the free drafters: suffix index, n-gram lookup, ...)")
    p.add_argument("--draft", dest="draft_old", metavar="SRC", help=argparse.SUPPRESS)  # before --draft-model
    p.add_argument("--self-draft", action="store_true",
                   help="also choose the decoder layers `--draft self` skips, measured on the parity text (minutes "
                   "on a CPU for a 1.5B target); without it the bundle cannot run --draft self")
    p.add_argument("-o", "--out", required=True, metavar="DIR", help="the bundle folder to create")
    p.add_argument("--quant", choices=QUANTS, default=None,
                   help="weight precision (default int4; a .gguf source keeps its own quantization where it maps "
                   "exactly, and --quant int4/int8 then caps the bits: docs/export.md)")
    p.add_argument("--via", choices=("auto", "native", "torch"), default="auto",
                   help="the exporter: auto (a .gguf file natively, without torch; a Hugging Face folder or hub id "
                   "with torch and onnxruntime-genai's builder), native, or torch (a .gguf dequantized by "
                   "transformers, for comparison)")
    from .native.plan import DEFAULT_MINIMUM, DEFAULT_Q6K_BLOCK, MINIMUMS

    p.add_argument("--gguf-minimum", choices=MINIMUMS, default=DEFAULT_MINIMUM,
                   help="a .gguf's blocks with a minimum (Q4_K, Q4_1, Q5_K, Q5_1): integer (default) keeps a "
                   "k-quant's minimums exact as the GGUF's own integers (a second small 4-bit product: 0.5 bits a "
                   "weight), offset keeps them exact as a float term (1 bit a weight), zero-point rounds the "
                   "minimum to MatMulNBits' integer zero points (fewest bytes, one more rounding; docs/export.md)")
    p.add_argument("--gguf-q6k-block", type=int, default=DEFAULT_Q6K_BLOCK, metavar="N",
                   help=f"a .gguf's Q6_K tensors (a Q4_K_M file's v, down and lm_head): rounded to 8 bits in blocks of N "
                   f"(default {DEFAULT_Q6K_BLOCK}: 8.25 bits a weight), or 0 to keep their blocks of 16 exactly (10 bits a "
                   "weight; docs/export.md)")
    p.add_argument("--draft-quant", choices=QUANTS,
                   help="the draft's precision (default: int4 under an int4 export, a .gguf draft's blocks rounded "
                   "to 4 bits: the target verifies every token; else --quant)")
    p.add_argument("--ep", default="cpu", metavar="FLAVORS",
                   help="graph flavor(s): cpu (float32, the CPU provider; default), cuda (float16 activations, "
                   "attention and KV cache, for the CUDA provider: Jetson), or cpu,cuda for both in one bundle "
                   "(the runtime picks the graph that matches its provider; docs/export.md)")
    p.add_argument("--block-size", type=int, default=None,
                   help="int4/int8 quantization block size: weights per scale (default 32; 128 decodes faster on "
                        "x86 CPUs, smaller blocks follow the source closer)")
    p.add_argument("--accuracy-level", type=int, default=4, choices=(0, 1, 2, 3, 4),
                   help="MatMulNBits compute type: 1 fp32, 2 fp16, 3 bf16, 4 int8 (default 4, fastest; 1-3 run "
                        "8-20x slower on x86)")
    p.add_argument("--head-bits", type=int, choices=(4, 8),
                   help="bits of the lm_head (and of a tied embedding) for int4/int8: default 8, the most "
                   "sensitive weight kept closer to the source at no measured speed cost; 4 is smallest")
    p.add_argument("--max-context", type=int, default=4096,
                   help="cache length the runtime uses by default (capped by the model's own limit; default 4096)")
    p.add_argument("--name", help="bundle name in the manifest (default: the folder name)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing bundle at --out")
    p.add_argument("--min-top1", type=float, metavar="F",
                   help="minimum top-1 agreement with the source model (default by quant: int4 0.85, int8 0.95, "
                   "fp16 0.97, fp32 0.99)")
    p.add_argument("--draft-min-top1", type=float, metavar="F", help="the same for the draft (default: --min-top1)")
    p.add_argument("--force", action="store_true", help="write the bundle even when parity is below the threshold")
    p.add_argument("--parity-tokens", type=int, default=None,
                   help="tokens of the parity text (default 512; 256 when every model is a .gguf exported natively)")
    p.add_argument("--draft-vocab", type=int, default=None, metavar="N",
                   help="keep the draft lm_head's rows for the N most frequent tokens only: a cheaper draft step, "
                   "the output unchanged (the target verifies); 0 = keep all (default: 32768 for an int4 export "
                   "whose draft has 65,536 ids or more). See docs/export.md")
    from edgespec_export.heads import METHODS, HeadsOptions

    p.add_argument("--heads", choices=METHODS, metavar="METHOD",
                   help="train draft heads on the target's own hidden states, here on this CPU (minutes): "
                   "medusa (one residual block per position) or feature (an EAGLE-style one-layer drafter over "
                   "the hidden state and the next token); then `--draft heads` at run time (docs/export.md, "
                   "\"Draft heads\")")

    d = HeadsOptions()  # the defaults live there
    p.add_argument("--heads-n", type=int, default=d.n_heads, metavar="N",
                   help=f"number of heads, or the feature drafter's chain length (default {d.n_heads})")
    p.add_argument("--heads-tokens", type=int, default=d.tokens, metavar="N",
                   help=f"tokens of training data, 1 in 5 documents held out (default {d.tokens})")
    p.add_argument("--heads-steps", type=int, default=d.steps, metavar="N", help=f"training steps (default {d.steps})")
    p.add_argument("--heads-answers", type=int, default=d.answers, metavar="N",
                   help=f"shipped prompts the target answers for the data (default {d.answers})")
    p.add_argument("--heads-vocab", type=int, default=d.vocab, metavar="N",
                   help=f"lm_head rows the heads score (default {d.vocab}; 0 = all)")
    p.add_argument("--heads-ffn", type=int, default=d.ffn, metavar="N",
                   help="feature drafter: its feed-forward block's intermediate size (default: the target's hidden size)")
    p.add_argument("--tune", action="store_true",
                   help="then time the target's candidate forms here and keep the fastest within the quality budget "
                   "(a .gguf target; `edgespec tune` after copying; docs/export.md, \"Tuning on the device\")")
    p.add_argument("--in-process", action="store_true",
                   help="build the models in this process instead of one child each (uses more memory)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run)
    from .tune import register as register_tune

    register_tune(sub)


def run(args: argparse.Namespace) -> int:
    from edgespec.errors import ExportError

    target = args.target_opt or args.source
    draft = flags.draft_model(args.draft_model, args.draft_old, "export")
    if args.target_opt and args.source and args.target_opt != args.source:
        raise ExportError(f"two targets given ({args.source} and --target {args.target_opt}): pass one")
    if not target:
        raise ExportError("no target: pass a Hugging Face folder, a .gguf file or a hub id (--target SRC)")
    if args.tune and not str(target).lower().endswith(".gguf"):
        raise ExportError(f"--tune: the target must be a .gguf file (the candidate forms are built from it), not {target}")
    _check_installed(args.via, [target, draft])
    from edgespec_export.heads import HeadsOptions
    from edgespec_export.pipeline import ExportOptions, run_export
    from edgespec_export.progress import TqdmProgress
    from pathlib import Path

    options = ExportOptions(
        quant=args.quant or "int4", keep_gguf_quant=args.quant is None, via=args.via,
        gguf_minimum=args.gguf_minimum, gguf_q6k_block=args.gguf_q6k_block, draft_quant=args.draft_quant, block_size=args.block_size,
        accuracy_level=args.accuracy_level, head_bits=args.head_bits, overwrite=args.overwrite, name=args.name, max_context=args.max_context,
        min_top1=args.min_top1, draft_min_top1=args.draft_min_top1, force=args.force,
        parity_tokens=args.parity_tokens, isolate=not args.in_process, eps=args.ep, draft_vocab=args.draft_vocab,
        self_draft=args.self_draft,
        heads=None if args.heads is None else HeadsOptions(
            method=args.heads, n_heads=args.heads_n, tokens=args.heads_tokens, steps=args.heads_steps,
            answers=args.heads_answers, vocab=args.heads_vocab, ffn=args.heads_ffn),
    )
    progress = TqdmProgress(enabled=not args.quiet and not args.json)
    summary = run_export(target, Path(args.out), draft=draft, options=options, progress=progress)
    if not args.json:
        print_summary(summary, sys.stdout)
    rows = None
    if args.tune:
        from .tune import HEADER, tune

        if not args.json:
            print(HEADER)
        rows = tune(Path(args.out), Path(target), progress=progress, out=None if args.json else sys.stdout)
    if args.json:
        from dataclasses import asdict

        print(json.dumps(dict(summary_dict(summary), **({"tuned": [asdict(r) for r in rows]} if rows else {})), indent=2))
    return 0


NATIVE_MODULES = ("onnx", "gguf", "numpy", "tokenizers", "tqdm")  # the base install: a .gguf, no torch
TORCH_MODULES = ("torch", "transformers", "onnxruntime_genai", "onnx", "onnx_ir", "gguf", "accelerate", "tqdm")


def _check_installed(via: str, specs: list) -> None:
    """One line naming what is missing for the exporter these sources need (before anything runs). The export
    half requires no particular onnxruntime (pip would replace a Jetson's onnxruntime-gpu with the CPU wheel,
    which owns the same module): any importable one checks parity, and none is the runtime's one line naming both."""
    import importlib.util

    from edgespec.errors import require_onnxruntime
    from edgespec.errors import ExportError

    require_onnxruntime()

    gguf_only = all(s is None or str(s).lower().endswith(".gguf") for s in specs)
    native = via == "native" or (via == "auto" and gguf_only)
    mods = NATIVE_MODULES if native else TORCH_MODULES
    missing = [m for m in mods if importlib.util.find_spec(m) is None]
    if not missing:
        return
    if native:
        raise ExportError(f"the exporter needs {', '.join(missing)}: pip install ./export  (from the edgespec "
                          "source tree)")
    raise ExportError(
        f"a Hugging Face folder or hub id (or --via torch) needs the exporter's torch extra ({', '.join(missing)} "
        "missing): pip install torch==2.13.0 && pip install './export[torch]'  (from the edgespec source tree); "
        "a .gguf file exports without it")


def summary_dict(s) -> dict:
    m = s.manifest
    return {
        "path": str(s.path),
        "bytes": s.total_bytes,
        "bytes_by_role": s.bytes_by_role,
        "seconds": round(s.seconds, 1),
        "peak_rss_bytes": {"process_tree": s.peak_rss_tree, "largest_process": s.peak_rss_single},
        "models": {role: {"arch": f.arch, "layers": f.layers, "params": f.params, "quant": f.quant,
                          "source": f.source, "parity": f.parity,
                          "graphs": {fl: {"path": g.path, "kv_dtype": g.kv_dtype, "activation_dtype": g.activation_dtype,
                                          "logits_dtype": g.logits_dtype, "parity": g.parity}
                                     for fl, g in f.graphs().items()}} for role, f in m.models.items()},
        "usable_vocab": m.tokenizer.usable_vocab,
        "drafting": m.drafting,
        "warnings": s.warnings,
    }


def _params(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.0f} M" if n >= 1e6 else f"{n / 1e3:.0f} K"


def print_summary(s, out) -> None:
    from edgespec.units import format_bytes

    m = s.manifest
    print(f"bundle {s.path}  ({format_bytes(s.total_bytes)}, {len(m.files)} files, verified)", file=out)
    for role, f in m.models.items():
        q = f.quant + (f" block {f.block_size} acc {f.accuracy_level}" if f.block_size else "")
        if f.head_bits and f.quant == "int4" and f.head_bits != 4:
            q += f" head {f.head_bits}-bit"
        graphs = f.graphs()
        for n, (flavor, g) in enumerate(graphs.items()):
            p = g.parity
            par = (f"top-1 {p['top1']:.1%}  mean KL {p['mean_kl']:.4f}  ({p['tokens']} tokens)" if p else "not checked")
            fl = f" [{flavor}: {g.activation_dtype or g.kv_dtype} activations, {g.kv_dtype} KV]" if len(graphs) > 1 or flavor != "cpu" else ""
            if n == 0:
                print(f"  {role:<6} {f.arch} {_params(f.params)} params, {f.layers} layers, {q}{fl}: "
                      f"{format_bytes(s.bytes_by_role.get(role, 0))}  parity {par}  <- {f.source}", file=out)
            else:
                print(f"  {'':<6} {g.path}{fl}: parity {par}", file=out)
    t = m.tokenizer
    print(f"  tokenizer: {t.usable_vocab} usable ids, eos {t.eos_ids}, add_bos {t.add_bos}", file=out)
    d = m.drafting
    if "draft_agreement" in d:
        print(f"  drafting: k={d['k']} (draft agrees with the target on {d['draft_agreement']:.0%} of the parity text)", file=out)
    print(f"  time {s.seconds:.0f} s, peak memory {format_bytes(s.peak_rss_single)} (largest process), "
          f"{format_bytes(s.peak_rss_tree)} (all processes)", file=out)
    for w in s.warnings:
        print(f"  warning: {w}", file=out)
