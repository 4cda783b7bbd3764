"""`edgespec bench BUNDLE`: every drafting mode on the same prompts in one process, interleaved,
with speed-ups as ratios within the run, where the time goes, and a labelled projection to boards."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ...bench.prompts import PROMPT_ORDERS
from ...bench.run import FIXED_K_MODES, MODES
from ...drafters import modes as drafting


def register(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="measure speculative modes against the target alone, side by side",
        description="Runs the target alone and each speculative mode on the same prompts in one process, "
        "interleaved (A B A B ...), and reports tokens/s, speed-up over the target alone within the run, time "
        "to first token, acceptance, tokens per target pass, peak RSS and whether each output equals the "
        "target's. See docs/bench.md.",
    )
    p.add_argument("bundle", help="bundle folder, or the name of one under $EDGESPEC_HOME/bundles (e.g. qwen-coder); "
                   "or a JSON file from an earlier --json: report, plot and project it again without measuring")
    p.add_argument("--prompts", default="code",
                   help="code, chat, multiturn, heldout, unseen, structured (answers held to JSON schemas), a .jsonl "
                        "file, or several joined by commas (default: code)")
    p.add_argument("--modes", default=None,
                   help=f"comma-separated from {','.join(MODES)} (target: the target alone; default: all "
                        "the bundle supports but self; self and model need two runs); a speculative mode + '+tree' "
                        "runs tree verification (tree on), + '+tree-auto' lets the cost model decide each round "
                        "(e.g. auto,auto+tree)")
    p.add_argument("--k", default=None, metavar="K,K,...",
                   help=f"also run {', '.join(FIXED_K_MODES)} with these fixed k "
                        "(adaptive k is always run)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); outputs are compared only then")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--limit", type=int, default=None, help="use only the first N prompts")
    p.add_argument("--order", choices=PROMPT_ORDERS, default="file",
                   help="the order the prompts run in: file (default), reverse, or interleave (one of each "
                        "category in turn); `auto` learns across requests, so its per-category figures depend "
                        "on what ran before (docs/bench.md)")
    p.add_argument("--json", dest="json_out", metavar="OUT.json", help="write everything as JSON")
    p.add_argument("--plot", metavar="OUT.png", help="write a PNG (needs the plot extra: matplotlib)")
    p.add_argument("--project", default="boards", metavar="DEVICE[,DEVICE]|boards|all|none",
                   help="project the run to these boards with a cost model, printed apart from the measurements "
                   "(default: boards = one of each kind: Jetson Orin Nano/NX/AGX, Raspberry Pi 5/4)")
    p.add_argument("--per-prompt", action="store_true", help="also print the table per prompt")
    p.add_argument("--max-len", type=int, default=None, help="cache length (default: the engine's)")
    p.add_argument("--threads", type=int, default=None, help="onnxruntime intra-op threads")
    p.add_argument("--deterministic", action="store_true",
                   help="open the engine in deterministic mode (docs/runtime.md): chains only, so '+tree' modes "
                        "are refused; compare a run with and without it for the mode's cost")
    p.add_argument("--peer", metavar="[NAME=]llama-cpp|URL|edgespec:BUNDLE", action="append", default=[],
                   help="also run each prompt through a peer on the same prompts, in this run, and print its tok/s "
                        "beside each mode: llama-cpp (the llama_cpp module on the same GGUF, --threads threads), the "
                        "http:// URL of a llama-server, or edgespec:BUNDLE (another bundle's target alone: the exact "
                        "form beside a tuned one). Repeat it for several, e.g. llama.cpp alone and a llama-server "
                        "started with --spec-type ngram-mod (docs/bench.md, 'A peer')")
    p.add_argument("--peer-gguf", metavar="FILE.gguf", default=None,
                   help="the GGUF --peer llama-cpp loads (default: the target's source GGUF in the model cache)")
    q = p.add_argument_group("a venue's questions (docs/bench.md, \"A venue's questions\")")
    q.add_argument("--questions", metavar="Q.jsonl", default=None,
                   help="ask these questions (each with the facts its answer must hold, or none: decline) instead of "
                   "--prompts, and score the answers: facts held, declines, retrieval recall, TTFT, tok/s")
    q.add_argument("--conditions", default=None, metavar="plain,by-hand,docs",
                   help="how each question is asked: plain (alone), by-hand (after its pages from --venue), docs (to "
                   "the engine with --docs); default: plain and by-hand, and docs with --docs. A condition may name its "
                   "own modes: plain:target,by-hand:target,docs:target+auto")
    q.add_argument("--docs", metavar="INDEX", default=None, help="the document index (edgespec index) the docs "
                   "condition asks through")
    q.add_argument("--venue", metavar="DIR", default=None, help="the folder of the pages the questions name (by-hand)")
    p.add_argument("--no-verify", action="store_true", help="skip the bundle's sha256 check")
    p.add_argument("--quiet", action="store_true", help="no progress line per generation")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ...bench import run as bench, projection
    from ...bench.prompts import load_prompts, order_prompts
    from ...models.bundle import Bundle
    from ...errors import InvalidRequest

    # every argument is checked before the models load (that takes seconds to minutes)
    if args.plot:
        from ...bench.plot import require_matplotlib

        require_matplotlib()
    if args.temperature < 0:
        raise InvalidRequest(f"--temperature must be >= 0, got {args.temperature}")
    if args.limit is not None and args.limit < 1:
        raise InvalidRequest(f"--limit must be at least 1, got {args.limit}")
    if args.questions is not None or args.docs is not None or args.venue is not None or args.conditions is not None:
        return run_questions(args)
    hw_list = projection.resolve_devices(args.project)
    if args.bundle.endswith(".json") and Path(args.bundle).is_file():
        if args.order != "file":
            raise InvalidRequest(f"--order {args.order}: a saved run is reported in the order it ran", param="order")
        result = bench.load_run(args.bundle)
        return _report(args, result, hw_list, projection.model_costs_from_meta(result.meta) if hw_list else {})
    prompts = load_prompts(args.prompts)
    if args.limit:
        prompts = prompts[: args.limit]
    prompts = order_prompts(prompts, args.order)
    from ...models.bundle import resolve_bundle

    b = Bundle.open(resolve_bundle(args.bundle), verify=not args.no_verify)
    if args.modes is None:
        # every mode the bundle runs in one engine: the self-draft needs a bench of its own, the
        # documents' drafter an engine opened with documents
        names = ",".join(n for n in MODES if n not in ("self", "docs") and (n != "model" or b.draft is not None)
                         and (n != "heads" or b.manifest.heads is not None))
    else:
        names = args.modes
    modes = bench.parse_modes(names, args.k, has_draft=b.draft is not None, has_heads=b.manifest.heads is not None)
    if args.deterministic and any(m.tree == "on" for m in modes):
        raise InvalidRequest("--deterministic runs chains only: leave the '+tree' modes out of --modes")
    if args.repeats < 1:
        raise InvalidRequest(f"--repeats must be at least 1, got {args.repeats}")
    if args.max_new_tokens < 1:
        raise InvalidRequest(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")

    if args.peer_gguf and not any(spec.endswith("llama-cpp") for spec in args.peer):
        raise InvalidRequest("--peer-gguf needs --peer llama-cpp", param="peer_gguf")
    peers = []
    if args.peer:
        from ...bench.peer import open_peers

        peers = open_peers(args.peer, gguf=args.peer_gguf, source=b.manifest.models["target"].source,
                           threads=args.threads or os.cpu_count() or 1, n_ctx=args.max_len or 4096)
    from ...engine import Engine

    draft = engine_mode(modes)  # e.g. "self" loads the self-draft; auto then also has it as an option
    print(f"loading {b.root} ...", file=sys.stderr, flush=True)
    engine = Engine.open(b, draft=draft, max_len=args.max_len, threads=args.threads, verify=False,
                         deterministic=args.deterministic)
    try:
        if any(m.draft == "model" for m in modes) and not engine.has_draft:
            raise InvalidRequest("--modes model: the draft model was not loaded (memory plan); leave 'model' out")
        total = args.repeats * len(prompts) * len(modes)
        print(f"{len(prompts)} prompt(s) x {len(modes)} mode(s) x {args.repeats} repeat(s) = {total} generations "
              f"of up to {args.max_new_tokens} tokens", file=sys.stderr, flush=True)

        def progress(s: bench.Sample, done: int, total: int) -> None:
            if args.quiet:
                return
            same = {True: "same", False: f"differs@{s.first_diff}", None: ""}[s.same_as_target]
            acc = f" accept {s.acceptance * 100:.0f}%" if s.acceptance is not None else ""
            print(f"[{done}/{total}] {s.prompt_id} {s.mode}: {s.decode_tps:.1f} tok/s{acc} {same}",
                  file=sys.stderr, flush=True)

        result = bench.run_bench(engine, prompts, modes, max_new_tokens=args.max_new_tokens, repeats=args.repeats,
                                 temperature=args.temperature, seed=args.seed, on_sample=progress, peers=peers)
        result.meta["prompt_order"] = args.order
        from ...edge import boardfit

        # what `edgespec plan --device X` says for every board, kept so a saved run's projection says it too
        result.meta["board_fits"] = boardfit.every_board(b, want_draft=engine.has_draft)
        from ...bench.bound import measure as measure_bound

        result.meta["bound"] = measure_bound(engine, result.samples, args.threads)  # same process, threads
    finally:
        engine.close()
        for peer in peers:
            peer.close()

    return _report(args, result, hw_list, projection.model_costs(b) if hw_list else {})


def _report(args: argparse.Namespace, result, hw_list, costs) -> int:
    from ...bench import report as bench_report, projection
    from ...bench.modework import collect_work
    from ...limits import DEFAULT_MAX_LEN

    projections = []
    if hw_list:
        work = collect_work(result.samples)
        max_len = result.meta.get("max_len") or DEFAULT_MAX_LEN
        need = result.meta.get("memory_need_bytes")
        fits = result.meta.get("board_fits") or {}
        projections = [projection.project(work, costs, hw, max_len=max_len, need_bytes=need, fit=fits.get(hw.id))
                       for hw in hw_list]
    print(bench_report.report_text(result, projections, hw_list, per_prompt=args.per_prompt))
    if args.json_out:
        bench_report.write_json(args.json_out, bench_report.report_json(result, projections))
        print(f"wrote {args.json_out}", file=sys.stderr)
    if args.plot:
        from ...bench.plot import plot

        plot(bench_report.summarize(result, "category"), args.plot, title=bench_report.header(result).splitlines()[0])
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


def run_questions(args: argparse.Namespace) -> int:
    """--questions: each question under each condition, the modes back to back, in one engine."""
    import json

    from ...bench import questions as qs
    from ...errors import InvalidRequest
    from ...models.bundle import Bundle, resolve_bundle

    if args.questions is None:
        raise InvalidRequest("--docs, --venue and --conditions go with --questions Q.jsonl", param="questions")
    questions = qs.load_questions(args.questions)
    if args.limit:
        questions = questions[: args.limit]
    venue = Path(args.venue).expanduser() if args.venue else None
    names = [m.strip() for m in (args.modes or "target,auto").split(",") if m.strip()]
    unknown = [m for m in names if m != "target" and m not in drafting.NAMES]
    if unknown:
        raise InvalidRequest(f"--modes: unknown mode(s) {unknown}; choose from target, {', '.join(drafting.NAMES)}",
                             param="modes")
    modes = ["target"] + [m for m in dict.fromkeys(names) if m != "target"]
    conditions, condition_modes = qs.parse_conditions(args.conditions, modes, docs=bool(args.docs))
    qs.check_venue(questions, venue, conditions)
    if args.max_new_tokens < 1:
        raise InvalidRequest(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    b = Bundle.open(resolve_bundle(args.bundle), verify=not args.no_verify)
    from ...engine import Engine

    print(f"loading {b.root} ...", file=sys.stderr, flush=True)
    extra = {"docs": args.docs} if args.docs else {}
    engine = Engine.open(b, draft="auto", max_len=args.max_len, threads=args.threads, verify=False, **extra)
    meta = {"bundle": str(b.root), "questions": args.questions, "n": len(questions), "conditions": conditions,
            "modes": modes, "condition_modes": condition_modes, "docs": args.docs, "max_new_tokens": args.max_new_tokens, "load": qs.load_average()}

    def progress(s, done: int, total: int) -> None:
        if not args.quiet:
            verdict = {True: "facts held", False: "facts missing", None: "declined" if s.declined else "answered"}[s.facts]
            print(f"[{done}/{total}] {s.question} {s.condition} {s.mode}: {verdict}, TTFT {s.ttft_s:.2f} s, "
                  f"{s.new_tokens} tokens", file=sys.stderr, flush=True)

    try:
        samples = qs.run_questions(qs.EngineAsker(engine), questions, conditions, modes, venue=venue,
                                   max_new_tokens=args.max_new_tokens, on_sample=progress,
                                   condition_modes=condition_modes)
    finally:
        engine.close()
    meta["load_after"] = qs.load_average()
    rows = qs.summarize(samples)
    print(qs.report_text(rows, meta))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(qs.report_json(rows, samples, meta), indent=2), encoding="utf-8")
        print(f"wrote {args.json_out}", file=sys.stderr)
    return 0


def engine_mode(columns) -> str:
    """The engine's mode: "self" for the self-draft, else the mode loading fewest runners the columns need."""
    needed = {r for m in columns for r in drafting.get(m.draft).loads}
    if not needed or "self" in needed:
        return "self" if needed else "ngram"
    return min((row for row in drafting.MODES if needed <= set(row.loads)), key=lambda row: len(row.loads)).name
