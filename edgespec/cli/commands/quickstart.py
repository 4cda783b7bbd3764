"""`edgespec quickstart`: the main job from nothing, in one command.

1. pull the default model pair (verified by sha256; a second run finds them in the cache);
2. export them into one bundle, $EDGESPEC_HOME/bundles/qwen-coder, once: a later run reuses it after a
   cheap check (manifest schema, every file present with its size, and the models it was built from);
3. stream a speculative generation on a sample prompt, then run the target alone on the same prompt,
   and show acceptance, tokens/s and the speed-up, measured side by side in this run.

The export (edgespec_export) builds each model in a child process: it peaks at many GB, and that
memory goes back to the system before the runtime loads the bundle.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from ...models.catalog import DEFAULT_BUNDLE  # light: a table of names

SAMPLE_PROMPT = ("Write a Python function `merge_intervals(intervals)` that merges overlapping "
                 "[start, end] intervals and returns them sorted. Include a docstring and a short example.")
STAMP = "quickstart.json"  # in the bundle's parent folder: which sources each quickstart bundle came from


def register(sub) -> None:
    p = sub.add_parser(
        "quickstart",
        help="pull the default models, export a bundle once, and show speculative decoding against the target alone",
        description="The main job from a fresh clone: fetch the default target + draft pair, export them into a "
        "bundle (once; later runs reuse it), stream a speculative generation on a sample prompt and compare it "
        "with the target alone on the same prompt.",
    )
    p.add_argument("--target", default=None, metavar="NAME|PATH",
                   help="target model: a registry name (see `edgespec models`), a .gguf file or a Hugging Face "
                   "folder (default: qwen2.5-coder-1.5b-instruct)")
    p.add_argument("--draft-model", default=None, metavar="NAME|PATH|none",
                   help="draft model, same forms, or 'none' (default: qwen2.5-coder-0.5b-instruct)")
    p.add_argument("--draft", dest="draft_old", default=None, help=argparse.SUPPRESS)  # before --draft-model
    p.add_argument("--bundle", default=None, metavar="DIR",
                   help=f"bundle folder (default: $EDGESPEC_HOME/bundles/{DEFAULT_BUNDLE})")
    p.add_argument("--re-export", action="store_true", help="export again even if the bundle looks fine")
    p.add_argument("--prompt", default=SAMPLE_PROMPT, help="the sample prompt (sent as a chat message)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--mode", choices=("auto", "model", "ngram"), default="auto",
                   help="drafting mode to show (the bundle is exported without --self-draft: see `edgespec export`)")
    p.add_argument("--no-compare", action="store_true", help="skip the target-alone run")
    p.add_argument("--threads", type=int, default=None, help="onnxruntime intra-op threads")
    p.add_argument("--quant", default="int4", choices=("int4", "int8", "fp16", "fp32"), help="export precision")
    p.set_defaults(func=run)


def say(msg: str) -> None:
    print(f"[quickstart] {msg}", file=sys.stderr, flush=True)


# --- 1. models -------------------------------------------------------------------------------------
def resolve_model(spec: str, role: str) -> tuple[Path, str]:
    """A registry name is pulled (fetched if missing); a path is used as it is. Returns the local path
    and a fingerprint of it for the reuse check (sha256 for known models, size+mtime for paths)."""
    from ...models import catalog, store
    from ...errors import InvalidRequest

    if spec in catalog.MODELS:
        path = store.ensure_model(spec)
        return path, f"sha256:{catalog.MODELS[spec].sha256}"
    p = Path(spec).expanduser()
    if not p.exists():
        known = ", ".join(sorted(catalog.MODELS))
        raise InvalidRequest(f"--{role} {spec!r}: not a known model ({known}) and no such file or folder")
    st = p.stat()
    return p.resolve(), f"path:{p.resolve()}:{st.st_size}:{st.st_mtime_ns}"


# --- 2. the bundle -----------------------------------------------------------------------------------
def bundle_problems(bundle: Path, fingerprint: dict) -> list[str]:
    """Why an existing bundle cannot be reused (empty: reuse it): the strict reading Bundle.open and
    `edgespec verify` run (verify.check), less the hashing of the weights; Engine.open still verifies
    the checksums when it loads them."""
    from .verify import check

    if not bundle.exists():
        return ["not exported yet"]
    manifest, problems = check(bundle, checksums=False)
    if problems or manifest is None:
        return problems or ["no manifest"]
    recorded = _read_stamp(bundle)
    if recorded is None:
        return []  # made by someone else (e.g. `edgespec export`): trust its manifest
    if recorded != fingerprint:
        return ["it was exported from other models or settings than the ones asked for now"]
    return []


def _stamp_path(bundle: Path) -> Path:
    return bundle.parent / f".{bundle.name}.{STAMP}"


def _read_stamp(bundle: Path) -> dict | None:
    try:
        return json.loads(_stamp_path(bundle).read_text())
    except (OSError, ValueError):
        return None


def export(target: Path, draft: Path | None, out: Path, quant: str, fingerprint: dict) -> None:
    """The export engineer's pipeline (edgespec_export), which builds each model in its own child
    process and writes the bundle atomically: an interrupted export leaves nothing that looks done."""
    from ...errors import ExportError

    try:
        from edgespec_export.pipeline import export_bundle
        from edgespec_export.progress import TqdmProgress
    except ImportError as e:
        raise ExportError(f"exporting needs the export extra ({e.name} is missing): "
                          "pip install torch==2.13.0 && pip install ./export") from None
    out.parent.mkdir(parents=True, exist_ok=True)
    say(f"exporting {target.name}" + (f" + {draft.name}" if draft else "") + f" -> {out} (once; several minutes)")
    t0 = time.monotonic()
    _stamp_path(out).unlink(missing_ok=True)
    export_bundle(str(target), out, draft=None if draft is None else str(draft), quant=quant, overwrite=True,
                  progress=TqdmProgress())
    _stamp_path(out).write_text(json.dumps(fingerprint))
    say(f"exported in {time.monotonic() - t0:.0f} s")


# --- 3. the demo ------------------------------------------------------------------------------------
def demo(bundle: Path, *, prompt: str, max_new_tokens: int, mode: str, compare: bool, threads: int | None,
         out=None) -> dict:
    """Streams the speculative generation, then runs the target alone on the same prompt, and prints
    both side by side. Returns the numbers (for tests and scripts)."""
    from ...engine import Engine

    out = out or sys.stdout
    say(f"loading {bundle} (checking sha256 of every file)")
    eng = Engine.open(bundle, draft="auto" if mode != "ngram" else "ngram", threads=threads)
    try:
        if mode == "model" and not eng.has_draft:
            mode = "auto"
        eng.warmup()
        messages = [{"role": "user", "content": prompt}]
        # a short warm-up of both paths so neither side pays one-off costs in the comparison
        eng.generate(messages=messages, max_new_tokens=8, draft=mode)
        eng.generate(messages=messages, max_new_tokens=8, draft="none")
        _fresh(eng)
        print(f"\n>>> {prompt}\n", file=out, flush=True)
        stream = eng.stream(messages=messages, max_new_tokens=max_new_tokens, draft=mode)
        for delta in stream:
            out.write(delta)
            out.flush()
        spec = stream.result
        out.write("\n\n")
        base = None
        if compare:
            say("running the target alone on the same prompt, for the comparison")
            _fresh(eng)
            base = eng.generate(messages=messages, max_new_tokens=max_new_tokens, draft="none")
    finally:
        eng.close()
    s = spec.stats
    res = {"mode": mode, "tokens": s.new_tokens, "tokens_per_s": s.decode_tokens_per_second, "ttft_s": s.ttft_s,
           "acceptance": s.acceptance_rate if s.drafted else None, "tokens_per_pass": s.tokens_per_pass,
           "rounds_by_source": dict(getattr(s, "rounds_by_source", {}) or {})}
    lines = [f"speculative ({mode}): {s.new_tokens} tokens, {s.decode_tokens_per_second:.1f} tokens/s, "
             f"first token after {s.ttft_s * 1e3:.0f} ms, acceptance "
             + (f"{s.acceptance_rate * 100:.0f}% of {s.drafted} proposals" if s.drafted else "- (nothing drafted)")
             + f", {s.tokens_per_pass:.2f} tokens per target pass"]
    if base is not None:
        b = base.stats
        ratio = s.decode_tokens_per_second / b.decode_tokens_per_second if b.decode_tokens_per_second else float("nan")
        same = spec.token_ids == base.token_ids
        res.update(target_tokens_per_s=b.decode_tokens_per_second, speedup=ratio, same_output=same)
        lines.append(f"target alone:      {b.new_tokens} tokens, {b.decode_tokens_per_second:.1f} tokens/s, "
                     f"first token after {b.ttft_s * 1e3:.0f} ms")
        lines.append(f"speed-up: {ratio:.2f}x (same prompt, same run)   output identical to the target alone: "
                     f"{'yes' if same else 'no (int4 kernels can flip near-tie tokens between batch sizes)'}")
    print("\n".join(lines), file=out, flush=True)
    return res


def _fresh(eng) -> None:
    from ...bench.run import fresh_cache

    fresh_cache(eng)


def run(args: argparse.Namespace) -> int:
    from ...models import catalog, files
    from ...errors import InvalidRequest
    from .. import flags

    if args.max_new_tokens < 1:
        raise InvalidRequest(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    target_spec = args.target or catalog.DEFAULT_TARGET
    draft_spec = flags.draft_model(args.draft_model, args.draft_old, "quickstart") or (
        catalog.DEFAULT_DRAFT if args.target is None else "none")
    if draft_spec in catalog.MODELS and target_spec in catalog.MODELS:
        t, d = catalog.MODELS[target_spec], catalog.MODELS[draft_spec]
        if t.family != d.family:
            raise InvalidRequest(f"--draft-model {draft_spec} ({d.family}) does not share a tokenizer with --target "
                                 f"{target_spec} ({t.family}): pick a draft of the same family, or 'none'")
    bundle = Path(args.bundle).expanduser() if args.bundle else files.bundles_dir() / DEFAULT_BUNDLE

    say("step 1/3: models")
    target, t_fp = resolve_model(target_spec, "target")
    draft, d_fp = (None, None) if draft_spec == "none" else resolve_model(draft_spec, "draft-model")
    fingerprint = {"target": t_fp, "draft": d_fp, "quant": args.quant}

    say("step 2/3: bundle")
    problems = ["--re-export given"] if args.re_export else bundle_problems(bundle, fingerprint)
    if problems:
        if bundle.exists():
            say(f"{bundle} will be exported again: {problems[0]}")
        export(target, draft, bundle, args.quant, fingerprint)
    else:
        say(f"reusing {bundle}")

    say("step 3/3: speculative generation, then the target alone for comparison")
    demo(bundle, prompt=args.prompt, max_new_tokens=args.max_new_tokens, mode=args.mode, compare=not args.no_compare,
         threads=args.threads)
    print(f"\nnext: edgespec bench {bundle} --prompts code,chat    (every mode, side by side)\n"
          f"      edgespec chat {bundle}", file=sys.stderr)
    return 0
