"""`edgespec plan BUNDLE --device D --memory-budget SIZE`: what would be loaded, with the numbers,
before loading anything (no onnxruntime session is created)."""
from __future__ import annotations

import json

from ...drafters import modes


def register(sub) -> None:
    p = sub.add_parser(
        "plan", help="show the memory plan for a bundle on a device (nothing is loaded)",
        description="Predict the memory a bundle needs on a device (weights, both KV caches, working memory) and "
                    "what fits a budget: a shorter cache, no draft model, or a refusal with the numbers.")
    p.add_argument("bundle", help="bundle folder (or the name of one under $EDGESPEC_HOME/bundles)")
    p.add_argument("--device", default=None, help="device profile, e.g. jetson-orin-nano-8gb, rpi5-8gb (default: this board)")
    p.add_argument("--memory-budget", default=None, metavar="SIZE",
                   help="e.g. 5GiB, 512M, 1.5G (default: the device's default budget, if it has one)")
    p.add_argument("--max-len", type=int, default=None, metavar="N",
                   help="wanted cache length (default: the bundle's, from export --max-context, capped by the device's)")
    p.add_argument("--draft", choices=modes.NAMES, default="auto",
                   help=f"the engine's drafting mode: {', '.join(m.name for m in modes.MODES if 'draft' in m.loads)} "
                        "plan with the draft model, the others without it")
    p.add_argument("--measure", action="store_true",
                   help="then load the plan in a fresh process, fill the caches and compare measured RSS with the "
                        "prediction (takes as long as a full-length prefill)")
    p.add_argument("--embedder", metavar="NAME|DIR", default=None,
                   help="count a sentence-embedding model beside the LLM (serve --embedder; e.g. all-minilm-l6-v2)")
    p.add_argument("--docs", metavar="INDEX", default=None,
                   help="count a document index held in memory (serve --docs), and the embedding model it names")
    p.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    p.add_argument("--root", default="/", metavar="DIR",
                   help="detect the board from /proc and /etc under DIR (a board's tree copied elsewhere)")
    p.set_defaults(func=run)


def run(args) -> int:
    from ...edge import boardfit, devices, gpumem, memcheck, memory
    from ...engine.measure import measure_fresh
    from ...units import format_size, parse_size
    from ...models.bundle import Bundle, resolve_bundle

    # a named board without a memory size (a Pi 4: 1-8 GB), or the board this runs on: the kernel's number
    profile = devices.with_measured_memory(devices.resolve(args.device, root=args.root), args.root)
    bundle = Bundle.open(resolve_bundle(args.bundle), verify=False)
    budget = parse_size(args.memory_budget) if args.memory_budget is not None else None
    want_draft = "draft" in modes.get(args.draft).loads
    here = not args.device or args.device == "auto" or profile.detected.get("memory_measured_on") == "this board"
    flavor, device = boardfit.runs_on(bundle, profile, here)
    context = None
    if args.measure and device == "cuda":  # the context first (a fresh process), so the plan uses it
        context = gpumem.measure_context_fresh(args.root, unified=profile.memory_shared_with_gpu)
    ctx_bytes = (context or {}).get("context_bytes")
    plan = memory.plan(bundle, max_len=args.max_len, want_draft=want_draft, budget_bytes=budget, profile=profile,
                       flavor=flavor, device=device, context_bytes=ctx_bytes,
                       doc_lines=_doc_lines(args))
    warning = memcheck.fits_now(plan, args.root) if here else None
    if modes.get(args.draft).runner == "draft" and not plan.load_draft:
        plan.notes.append("--draft model asked for, but the plan has no draft model: the engine would refuse")
    check, rss = None, {}
    if args.measure:
        # opened as the engine would be on this board: the same provider order, so the same graph
        rss = measure_fresh(bundle.root, max_len=plan.max_len, load_draft=plan.load_draft,
                            providers=devices.engine_defaults(profile)["providers"])
        check = memcheck.compare(plan, rss["peak"] + (rss.get("device_used_delta") or 0) * plan.unified)
    device_measured = rss.get("device_used_delta")
    device_note = (rss.get("device_note") or "device memory not measured") if args.measure and device_measured is None else None
    estimated = [k for k in ("cuda_context", "cublas_workspace") if not (k == "cuda_context" and ctx_bytes is not None)]
    if args.json:
        out = {"bundle": str(bundle.root), "device": profile.id, "memory_bytes": profile.memory_bytes,
               "memory_source": _memory_source(profile), **plan.to_dict()}
        if warning:
            out["warning"] = warning
        if check is not None:
            out["measured_peak_bytes"] = check.measured_bytes
            out["error"] = round(check.error, 4)
        if plan.device_breakdown:
            out["device_plan"] = {"predicted_bytes": plan.device_bytes, "breakdown": plan.device_breakdown,
                                  "estimated": estimated, "counted_in_budget": plan.unified}
        if context is not None:
            out["cuda_context_measured_bytes"] = ctx_bytes
            if ctx_bytes is None:
                out["cuda_context_note"] = context.get("note")
        if args.measure:
            out["device_measured_bytes"] = device_measured
            if "shared_used_delta" in rss:
                out["shared_measured_bytes"] = rss["shared_used_delta"]
            if device_note:
                out["device_note"] = device_note
        print(json.dumps(out, indent=2))
        return 0
    mem = f", {format_size(profile.memory_bytes)} memory" if profile.memory_bytes else ""
    print(f"bundle {bundle.name} ({bundle.root}) on {profile.name} ({profile.id}{mem})")
    print(f"memory: {_memory_source(profile)}")
    if context is not None:
        print(f"CUDA context: measured {format_size(ctx_bytes)} in a fresh process ({context.get('reader')})"
              if ctx_bytes is not None else f"CUDA context: not measured ({context.get('note')}); the estimate is used")
    print(plan.describe())
    if warning:
        print(f"warning: {warning}")
    if check is not None:
        print(check.describe() + " after filling the caches to max_len"
              + (" (RSS + device memory: one DRAM)" if plan.unified and device_measured is not None else ""))
    if plan.device_breakdown and not plan.unified:
        print(f"device memory on the CUDA provider, apart from the host budget ({', '.join(estimated)}: "
              "estimates, projected, not measured):")
        for k, v in plan.device_breakdown.items():
            if v:
                print(f"  {k:<18}  {format_size(v):>10}")
        print(f"  {'total':<18}  {format_size(plan.device_bytes):>10}")
    elif plan.unified:
        print(f"device lines: projected ({', '.join(estimated)} estimated), counted in the budget: "
              "host and GPU share this board's DRAM")
    if device_measured is not None:
        print(f"device memory: measured {format_size(device_measured)} used by the process, the CUDA context "
              f"included ({rss.get('device_reader')}, read before the context existed)"
              + (f"; the plan's device side: {format_size(plan.device_bytes)}" if plan.device_breakdown else ""))
    elif device_note:
        print(f"device memory: {device_note}")
    return 0


def _doc_lines(args) -> dict:
    """The memory plan's lines for --embedder and --docs (the embedder the index names, without --embedder)."""
    from pathlib import Path

    from ...edge import memory
    from ...errors import InvalidRequest
    from ...docs.embedder_folder import files_bytes

    if args.docs is not None and not (Path(args.docs) / "manifest.json").is_file():
        raise InvalidRequest(f"--docs {args.docs}: no index here (manifest.json is missing): build one with `edgespec index`")
    return memory.doc_lines(*files_bytes(args.embedder, args.docs))


def _memory_source(profile) -> str:
    """Where the board's memory size came from, in words (the default budget follows from it)."""
    from ...units import format_size

    det = profile.detected
    src = det.get("memory_source")
    if src == "measured":
        on = det.get("memory_measured_on")
        if on is None or on == "this board":
            return f"{format_size(profile.memory_bytes)} measured on this board (/proc/meminfo MemTotal)"
        return (f"{format_size(profile.memory_bytes)} measured on {on} (/proc/meminfo MemTotal): the {profile.id} "
                f"profile has no memory size; give --memory-budget for the board you plan for")
    if src == "profile":
        return f"{format_size(profile.memory_bytes)} from the {profile.id} profile (not measured: not this board)"
    return "unknown: the profile has no size and /proc/meminfo could not be read; give --memory-budget"
