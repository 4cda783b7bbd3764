"""The Python half of scripts/gpu-check.sh: what bash is poor at.

    python -m edgespec.bench.gpucheck junit REPORT.xml    # exit 0 only when some test really ran and passed
    python -m edgespec.bench.gpucheck preload             # onnxruntime.preload_dlls(), saying what it did
    python -m edgespec.bench.gpucheck summary REPORT_DIR  # the findings of a check run, as markdown lines
    python -m edgespec.bench.gpucheck shape target|draft [--small]   # the real pair's shapes, make_gguf keywords
    python -m edgespec.bench.gpucheck steps BUNDLE [--provider cuda|cpu] [--bench RUN.json] [--json OUT.json]
                                          # step costs at a real model's shape, the verify slope, projections

`shape` and `steps` are the shape check's (bench/shapecheck.py; scripts/gpu-check.sh --shape-check).

Why `junit`: pytest exits 0 when every test skipped, and tests/bench/test_gpu.py skips everything where the
CUDA provider does not work; a GPU check that records that as passed says the GPU path works when
nothing ran on the GPU. The JUnit XML that pytest writes counts tests, skips, failures and errors.

Why `preload`: onnxruntime-gpu from PyPI finds the CUDA and cuDNN libraries that its `[cuda,cudnn]`
extras install (the nvidia-* wheels) only when they are loaded before the first CUDA session
(`onnxruntime.preload_dlls()`, onnxruntime >= 1.21). edgespec's own sessions do it
(edge/providers.py); the check's venv does it at every start too, for code that opens sessions itself.
"""
from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

MIB = 1 << 20


@dataclass(frozen=True)
class JunitCounts:
    tests: int
    skipped: int
    failures: int
    errors: int

    @property
    def ran(self) -> int:
        return self.tests - self.skipped

    def verdict(self) -> tuple[bool, str]:
        """(passed, one line): failed when anything failed, and when nothing ran (all skipped or none)."""
        line = f"{self.tests} tests: {self.ran} ran, {self.skipped} skipped, {self.failures} failed, {self.errors} errors"
        if self.failures or self.errors:
            return False, line
        if self.ran <= 0:
            return False, line + ": every test skipped, so nothing was checked (see the skip reasons in the log)"
        return True, line


def junit_counts(path: str) -> JunitCounts:
    """Sums the <testsuite> counters of a pytest JUnit XML file (one suite, or several under <testsuites>)."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    total = {"tests": 0, "skipped": 0, "failures": 0, "errors": 0}
    for s in suites:
        for k in total:
            total[k] += int(s.get(k, 0) or 0)
    return JunitCounts(**total)


def preload() -> str:
    """providers.preload_cuda_libraries, for every process of the check's venv (its .pth calls this),
    including those that open sessions without edgespec's providers module (bench/placement.py)."""
    from ..edge.providers import preload_cuda_libraries

    return preload_cuda_libraries()


def summary(report: str | Path) -> list[str]:
    """What a run found, one line per fact, from the files the steps wrote (whichever exist): the GPU
    tests' counts, each graph's placement, each plan against its measurement, each bench's speed-ups."""
    report = Path(report)
    out = ["", "## Findings"]
    if (report / "test_gpu.xml").exists():
        out.append(f"- tests/bench/test_gpu.py: {junit_counts(str(report / 'test_gpu.xml')).verdict()[1]}")
    for f in sorted(report.glob("placement-*.json")):
        for graph, p in _json(f).items():
            key, off = next(((k, v) for k, v in p.items() if k.startswith("key_ops_off_")), ("key_ops_off_?", []))
            out.append(f"- placement {f.stem[10:]} {graph}: session on {p['providers'][0]}; {len(off)} GroupQueryAttention/"
                       f"MatMulNBits nodes off {key[12:]}, {len(p['memcpy_inside_layers'])} Memcpy inside layers")
    for f in sorted(report.glob("plan-*.json")):
        p = _json(f)
        line = f"- plan {f.stem[5:]}: predicted {p['predicted_bytes'] / MIB:.0f} MiB"
        if p.get("measured_peak_bytes") is not None:
            line += f", measured {p['measured_peak_bytes'] / MIB:.0f} MiB ({100 * p['error']:+.1f} %)"
        if p.get("device_bytes"):
            line += f"; device side {p['device_bytes'] / MIB:.0f} MiB {'in' if p.get('unified') else 'apart from'} the budget"
        for key, what in (("device_measured_bytes", "device measured"), ("cuda_context_measured_bytes", "CUDA context measured")):
            if p.get(key) is not None:
                line += f", {what} {p[key] / MIB:.0f} MiB"
        out.append(line + "".join(f"; {p[k]}" for k in ("device_note", "cuda_context_note") if p.get(k)))
    for f in sorted(report.glob("bench-*.json")):
        rows = _json(f)["summary"]["by_category"]
        tps = {}
        for r in rows:  # tokens / seconds over every category, per mode
            t, s = tps.get(r["mode"], (0, 0.0))
            tps[r["mode"]] = (t + r["tokens"], s + r["tokens"] / max(r["tokens_per_s"], 1e-9))
        rate = {m: t / s for m, (t, s) in tps.items() if s}
        base = rate.get("target")
        out.append(f"- bench {f.stem[6:]}: " + ", ".join(
            f"{m} {v:.1f} tok/s" + (f" ({v / base:.2f}x)" if base and m != "target" else "") for m, v in rate.items()))
    return out if len(out) > 2 else []


def _json(path: Path):
    return json.loads(path.read_text())


def _shape_main(args: list[str]) -> int:
    import argparse

    from . import shapecheck

    ap = argparse.ArgumentParser(prog=f"python -m edgespec.bench.gpucheck {args[0]}")
    if args[0] == "shape":
        ap.add_argument("role", choices=("target", "draft"))
        ap.add_argument("--small", action="store_true", help="the small stand-in (a run on the CPU provider)")
        a = ap.parse_args(args[1:])
        print(json.dumps(shapecheck.shape(a.role, a.small)))
        return 0
    ap.add_argument("bundle")
    ap.add_argument("--provider", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--past", type=int, default=128, help="tokens in the cache when a step is timed (default 128)")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per cost, after a warm-up (median; default 5)")
    ap.add_argument("--max-n", type=int, default=16, help="the largest step timed, in tokens (default 16)")
    ap.add_argument("--bench", default=None, metavar="RUN.json",
                    help="an `edgespec bench --json` run of the real pair on the CPU: project its modes on these costs")
    ap.add_argument("--json", default=None, metavar="OUT.json", help="also write the costs (and projection) here")
    a = ap.parse_args(args[1:])
    if a.past < 1 or a.repeats < 1 or not 1 <= a.max_n <= 64:
        ap.error("--past and --repeats must be >= 1, --max-n in 1..64")
    steps = shapecheck.measure(a.bundle, provider=a.provider, past=a.past, repeats=a.repeats,
                               sizes=tuple(range(1, a.max_n + 1)))
    projection = None
    if a.bench:
        projection = shapecheck.project(steps, _json(Path(a.bench)))
        steps["projection"] = projection
    if a.json:
        shapecheck.write_json(a.json, steps)
    print("\n".join(shapecheck.render(steps, projection)))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 2 and args[0] == "junit":
        try:
            ok, line = junit_counts(args[1]).verdict()
        except (OSError, ET.ParseError) as e:
            ok, line = False, f"no readable JUnit report at {args[1]}: {e}"
        print(f"gpu-check: {line}")
        return 0 if ok else 5
    if len(args) == 2 and args[0] == "summary":
        print("\n".join(summary(args[1])))
        return 0
    if args[:1] in (["shape"], ["steps"]):
        return _shape_main(args)
    if args == ["preload"]:
        print(f"gpu-check: {preload()}")
        return 0
    print("usage: python -m edgespec.bench.gpucheck junit REPORT.xml | preload | summary REPORT_DIR | shape ROLE [--small]"
          " | steps BUNDLE [--provider cuda|cpu] [--bench RUN.json] [--json OUT.json]", file=sys.stderr)
    return 64


if __name__ == "__main__":
    raise SystemExit(main())
