"""`edgespec quickstart`: the main job from nothing, in one command.

1. pull the default model pair (verified by sha256; a second run finds them in the cache);
2. export them into one bundle, $EDGESPEC_HOME/bundles/qwen-coder, once: a later run reuses it after a
   cheap check (manifest schema, every file present with its size, and the models it was built from);
3. two prompts, one whose answer is fresh code and one that edits code it is given: after a warm-up,
   each runs with the target alone and with drafting (streamed) in this one process, and one line
   says why drafting paid or did not on this machine, from the measured acceptance and pass costs.

The export (edgespec_export) builds each model in a child process: it peaks at many GB, and that
memory goes back to the system before the runtime loads the bundle.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
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
    p.add_argument("--prompt", default=SAMPLE_PROMPT, help="the prompt whose answer is fresh text (sent as a chat message)")
    p.add_argument("--edit-prompt", default=EDIT_PROMPT, help="the prompt whose answer edits code it is given")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--mode", choices=("auto", "model", "suffix", "ngram"), default="auto",
                   help="drafting mode to show (the bundle is exported without --self-draft: see `edgespec export`)")
    p.add_argument("--no-compare", action="store_true", help="skip the target-alone runs")
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
    from ..export_half import load

    pipeline, progress = load("pipeline", "exporting"), load("progress", "exporting")
    out.parent.mkdir(parents=True, exist_ok=True)
    say(f"exporting {target.name}" + (f" + {draft.name}" if draft else "") + f" -> {out} (once; a few minutes)")
    t0 = time.monotonic()
    _stamp_path(out).unlink(missing_ok=True)
    pipeline.export_bundle(str(target), out, draft=None if draft is None else str(draft), quant=quant,
                           overwrite=True, progress=progress.TqdmProgress())
    _stamp_path(out).write_text(json.dumps(fingerprint))
    say(f"exported in {time.monotonic() - t0:.0f} s")


# --- 3. the demo ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DemoPrompt:
    name: str  # how the summary names it
    text: str  # sent as one chat message


# The function the edit prompt hands over: an answer that keeps most of it is what copying drafters
# (the suffix index, n-gram lookup) propose for almost nothing.
EDIT_CODE = """def moving_average(values, window):
    result = []
    total = 0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        if i >= window - 1:
            result.append(total / window)
    return result


def count_words(text):
    counts = {}
    for word in text.lower().split():
        word = word.strip(".,;:!?")
        if word:
            counts[word] = counts.get(word, 0) + 1
    return counts
"""
EDIT_PROMPT = ("Add type hints and a one-line docstring to each of these Python functions. Keep the code "
               "otherwise exactly as it is and reply with the full code only.\n\n```python\n" + EDIT_CODE + "```")
NOISE = 0.05  # a speed-up within 5 % of 1.0 is "about even": one pass of one prompt moves that much on a busy CPU


def demo_prompts(fresh: str = SAMPLE_PROMPT, edit: str = EDIT_PROMPT) -> list[DemoPrompt]:
    """The two kinds of answer that decide whether drafting pays: fresh text, which only a draft model
    can guess, and an edit of given code, which mostly copies the prompt."""
    return [DemoPrompt("fresh code", fresh), DemoPrompt("code edit", edit)]


def demo(bundle: Path, *, prompts: list[DemoPrompt] | None = None, max_new_tokens: int, mode: str, compare: bool,
         threads: int | None, out=None) -> dict:
    """Warms both paths up on every prompt, then, prompt by prompt, runs the target alone and streams the
    speculative answer, each from an empty cache, in this one process; prints both side by side and one
    line on why drafting paid or did not here. Returns the numbers (for tests and scripts)."""
    from ...engine import Engine

    out = out or sys.stdout
    prompts = prompts or demo_prompts()
    say(f"loading {bundle} (checking sha256 of every file)")
    eng = Engine.open(bundle, draft="auto" if mode not in ("ngram", "suffix") else mode, threads=threads)
    rows = []
    try:
        if mode == "model" and not eng.has_draft:
            mode = "auto"
        say("warming up: a few tokens of every prompt, with drafting and without")
        for p in prompts:  # one-off costs (allocations, first step sizes) paid before anything is timed
            msgs = [{"role": "user", "content": p.text}]
            eng.generate(messages=msgs, max_new_tokens=8, draft=mode)
            if compare:
                eng.generate(messages=msgs, max_new_tokens=8, draft="none")
        for p in prompts:
            msgs = [{"role": "user", "content": p.text}]
            base = None
            if compare:
                say(f"{p.name}: the target alone first (not shown), then with drafting")
                _fresh(eng)
                base = eng.generate(messages=msgs, max_new_tokens=max_new_tokens, draft="none")
            _fresh(eng)
            first, *more = p.text.splitlines() or [""]
            print(f"\n>>> {first}{' ...' if more else ''}\n", file=out, flush=True)
            stream = eng.stream(messages=msgs, max_new_tokens=max_new_tokens, draft=mode)
            for delta in stream:
                out.write(delta)
                out.flush()
            out.write("\n")
            rows.append(_row(p.name, stream.result, base))
    finally:
        eng.close()
    lines = ["", summary_table(mode, rows)]
    if compare:
        lines.append(why_line(rows))
    print("\n".join(lines), file=out, flush=True)
    return {"mode": mode, "prompts": rows, "why": why_line(rows) if compare else None}


def _row(name: str, spec, base) -> dict:
    """One prompt's figures. `pass_cost`: the mean time of a target pass with drafting (its draft steps
    and its verify), in plain 1-token steps of the target alone measured on the same prompt."""
    s = spec.stats
    row = {"name": name, "tokens": s.new_tokens, "tokens_per_s": s.decode_tokens_per_second, "ttft_s": s.ttft_s,
           "drafted": s.drafted, "acceptance": s.acceptance_rate if s.drafted else None,
           "tokens_per_pass": s.tokens_per_pass, "rounds_by_source": dict(s.rounds_by_source or {})}
    if base is not None:
        b = base.stats
        speedup = s.decode_tokens_per_second / b.decode_tokens_per_second if b.decode_tokens_per_second else float("nan")
        row.update(target_tokens_per_s=b.decode_tokens_per_second, speedup=speedup,
                   pass_cost=s.tokens_per_pass / speedup if speedup else float("nan"),
                   same_output=spec.token_ids == base.token_ids)
    return row


def summary_table(mode: str, rows: list[dict]) -> str:
    head = f"{'':<18} {'target alone':>13} {f'drafting ({mode})':>17} {'speed-up':>9}  acceptance          tokens/pass"
    lines = [head]
    for r in rows:
        acc = f"{r['acceptance'] * 100:.0f}% of {r['drafted']}" if r["drafted"] else "nothing drafted"
        base = f"{r['target_tokens_per_s']:.1f} tok/s" if "speedup" in r else "-"
        ratio = f"{r['speedup']:.2f}x" if "speedup" in r else "-"
        lines.append(f"{r['name']:<18} {base:>13} {r['tokens_per_s']:>11.1f} tok/s {ratio:>9}  {acc:<19} "
                     f"{r['tokens_per_pass']:.2f}")
    same = [r["same_output"] for r in rows if "same_output" in r]
    if same:
        lines.append("outputs identical to the target alone: " + (
            "yes" if all(same) else f"{sum(same)} of {len(same)} (int4 kernels can flip near-tie tokens between "
            "step sizes; every output is still the target's own greedy text)"))
    return "\n".join(lines)


SOURCE_WORDS = {"suffix": "mostly copied from earlier text", "ngram": "mostly copied from the prompt",
                "recycle": "mostly the target's own runners-up", "model": "mostly the draft model",
                "heads": "mostly the draft heads", "self": "mostly the self-draft"}


def why_line(rows: list[dict]) -> str:
    """One line: why drafting paid or did not on this machine, from each prompt's measured acceptance,
    tokens per target pass, where the proposals came from, and what a pass with drafting cost in plain
    target steps (speed-up = tokens per pass / pass cost)."""
    def verdict(r: dict) -> str:
        return "paid" if r["speedup"] >= 1 + NOISE else "lost" if r["speedup"] <= 1 - NOISE else "even"

    def figures(r: dict) -> str:
        if not r["drafted"]:
            return f"{r['name']}: nothing drafted, no source promised a gain ({r['speedup']:.2f}x)"
        used = {k: v for k, v in (r.get("rounds_by_source") or {}).items() if k != "none" and v}
        source = f", {SOURCE_WORDS.get(max(used, key=used.get), 'mostly ' + max(used, key=used.get))}" if used else ""
        return (f"{r['name']}: {r['tokens_per_pass']:.2f} tokens a target pass ({r['acceptance'] * 100:.0f}% of "
                f"{r['drafted']} proposals accepted{source}) for {r['pass_cost']:.2f} plain steps = {r['speedup']:.2f}x")

    rows = [r for r in rows if "speedup" in r]
    if not rows:
        return ""
    paid = [r for r in rows if verdict(r) == "paid"]
    rest = [r for r in rows if verdict(r) != "paid"]
    if not rest:
        head, tail = "drafting paid", "each pass with drafting wrote more tokens than it cost plain steps"
    elif paid:
        head = (f"drafting paid on the {' and '.join(r['name'] for r in paid)} and not on the "
                f"{' and '.join(r['name'] for r in rest)}")
        tail = "a pass pays only where it writes clearly more tokens than it costs plain steps"
    else:
        dear = any(r["drafted"] and r["pass_cost"] > r["tokens_per_pass"] * (1 + NOISE) for r in rows)
        head = "drafting did not pay on this machine"
        tail = (f"a pass with drafting cost {'more plain steps than' if dear else 'about as many plain steps as'} it "
                "wrote tokens (where a verify of several tokens costs about one step, as on a board's GPU, the same "
                "acceptance pays more: docs/speed.md)")
    return f"why: {head}. {'; '.join(figures(r) for r in (paid + rest))}. So {tail}."


def _fresh(eng) -> None:
    from ...bench.run import fresh_cache

    fresh_cache(eng)


def run(args: argparse.Namespace) -> int:
    from ...models import catalog, files
    from ...errors import InvalidRequest
    from ... import flags

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

    say("step 3/3: two prompts with drafting and with the target alone, side by side")
    demo(bundle, prompts=demo_prompts(args.prompt, args.edit_prompt), max_new_tokens=args.max_new_tokens,
         mode=args.mode, compare=not args.no_compare, threads=args.threads)
    print(f"\nnext: edgespec bench {bundle} --prompts code,chat    (every mode, side by side)\n"
          f"      edgespec chat {bundle}", file=sys.stderr)
    return 0
