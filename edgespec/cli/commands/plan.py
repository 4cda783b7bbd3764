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
    p.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    p.add_argument("--root", default="/", metavar="DIR",
                   help="detect the board from /proc and /etc under DIR (a board's tree copied elsewhere)")
    p.set_defaults(func=run)


def run(args) -> int:
    from ...edge import devices, memory
    from ...engine import build
    from ...engine.measure import measure_fresh
    from ...units import format_size, parse_size
    from ...models.bundle import Bundle
    from ...models.bundle import resolve_bundle

    # a named board without a memory size (a Pi 4: 1-8 GB), or the board this runs on: the kernel's number
    profile = devices.with_measured_memory(devices.resolve(args.device, root=args.root), args.root)
    bundle = Bundle.open(resolve_bundle(args.bundle), verify=False)
    budget = parse_size(args.memory_budget) if args.memory_budget is not None else None
    want_draft = "draft" in modes.get(args.draft).loads
    # the provider order the engine would use on this board: the plan counts the graph it would load
    providers = devices.engine_defaults(profile)["providers"]
    plan = build.memory_plan(bundle, max_len=args.max_len, want_draft=want_draft, profile=profile, budget=budget,
                             providers=providers)
    here = not args.device or args.device == "auto" or profile.detected.get("memory_measured_on") == "this board"
    warning = memory.fits_now(plan, args.root) if here else None
    if modes.get(args.draft).runner == "draft" and not plan.load_draft:
        plan.notes.append("--draft model asked for, but the plan has no draft model: the engine would refuse")
    device = _device_plan(bundle, plan, profile)
    check = None
    device_measured, device_note = None, None
    if args.measure:
        rss = measure_fresh(bundle.root, max_len=plan.max_len, load_draft=plan.load_draft, providers=providers)
        check = memory.compare(plan, rss["peak"])
        device_measured = rss.get("device_used_delta")
        if device_measured is None:
            device_note = rss.get("device_note") or "device memory not measured"
    if args.json:
        out = {"bundle": str(bundle.root), "device": profile.id, "memory_bytes": profile.memory_bytes,
               "memory_source": _memory_source(profile), **plan.to_dict()}
        if warning:
            out["warning"] = warning
        if check is not None:
            out["measured_peak_bytes"] = check.measured_bytes
            out["error"] = round(check.error, 4)
        if device is not None:
            out["device_plan"] = {"predicted_bytes": sum(device.values()), "breakdown": device,
                                  "estimated": ["cuda_context", "cublas_workspace", "trt_workspace"]}
        if args.measure:
            out["device_measured_bytes"] = device_measured
            if device_note:
                out["device_note"] = device_note
        print(json.dumps(out, indent=2))
    else:
        mem = f", {format_size(profile.memory_bytes)} memory" if profile.memory_bytes else ""
        print(f"bundle {bundle.name} ({bundle.root}) on {profile.name} ({profile.id}{mem})")
        print(f"memory: {_memory_source(profile)}")
        print(plan.describe())
        if warning:
            print(f"warning: {warning}")
        if check is not None:
            print(check.describe() + " after filling the caches to max_len")
        if device is not None:
            print("device memory if run on the CUDA provider (cuda-flavored graphs; context and workspaces "
                  "are estimates, not measurements):")
            for k, v in device.items():
                if v:
                    print(f"  {k:<18}  {format_size(v):>10}")
            print(f"  {'total':<18}  {format_size(sum(device.values())):>10}"
                  + ("  (same DRAM as the host plan on a Jetson: add them)" if profile.id.startswith("jetson") else ""))
        if device_measured is not None:
            print(f"device memory: measured {format_size(device_measured)} used by the process (cudaMemGetInfo delta)")
        elif device_note:
            print(f"device memory: {device_note}")
    return 0


def _device_plan(bundle, plan, profile) -> dict | None:
    """The device side of the plan, for a bundle with cuda-flavored graphs (else None)."""
    from ...edge import memory
    from ...edge.providers import TRT, normalize

    if not any("cuda" in f.graphs() for f in bundle.manifest.models.values()):
        return None
    order = normalize(getattr(profile, "providers", None) or None)
    trt = getattr(profile, "trt", None) or {}
    workspace = int(float(trt.get("workspace_gib", 1)) * (1 << 30)) if TRT in order else 0
    return memory.predict_device(bundle, plan.max_len, plan.load_draft, prefill_chunk=plan.prefill_chunk,
                                 trt_workspace=workspace)


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
