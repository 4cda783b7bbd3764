"""`edgespec doctor [--json] [--bundle B]`: board, memory, providers that really work, sensors, power mode,
throttling and the settings to use; the onnxruntime floor; with --bundle, which nodes TensorRT would take. Exit 1 when not even the CPU provider runs."""
from __future__ import annotations

import json


def register(sub) -> None:
    p = sub.add_parser(
        "doctor", help="check this board: providers that work, memory, sensors, power mode",
        description="Detect the board, try every execution provider with a tiny session, read the power and "
                    "temperature sensors, and print recommended settings and what is missing (with how to "
                    "install it).")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.add_argument("--device", default=None, help="use this device profile instead of detecting the board")
    p.add_argument("--no-probe", action="store_true", help="do not create test sessions (faster)")
    p.add_argument("--bundle", default=None, metavar="BUNDLE",
                   help="also say which nodes of this bundle's graphs TensorRT would take (read from the graphs)")
    p.add_argument("--root", default="/", metavar="DIR",
                   help="read /proc, /sys and /etc under DIR (a board's tree copied or mounted elsewhere)")
    p.set_defaults(func=run)


def run(args) -> int:
    from ...edge.doctor import collect, render, tensorrt_report

    report = collect(args.root, device=args.device, probe=not args.no_probe)
    if args.bundle:
        report["tensorrt_nodes"] = tensorrt_report(args.bundle)
        from ...edge.tuned import bundle_note
        from ...models.bundle import resolve_bundle

        report["tuned_elsewhere"] = bundle_note(resolve_bundle(args.bundle))
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        print(render(report))
        if report.get("tuned_elsewhere"):
            print(f"{'bundle':<12} {report['tuned_elsewhere']}")
    cpu = [r for r in report["providers"] if r["provider"] == "cpu"]
    return 1 if cpu and cpu[0]["works"] is False else 0
