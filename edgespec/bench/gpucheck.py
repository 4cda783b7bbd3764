"""The Python half of scripts/gpu-check.sh: what bash is poor at.

    python -m edgespec.bench.gpucheck junit REPORT.xml    # exit 0 only when some test really ran and passed
    python -m edgespec.bench.gpucheck preload             # onnxruntime.preload_dlls(), saying what it did
    python -m edgespec.bench.gpucheck summary REPORT_DIR  # the findings of a check run, as markdown lines

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
    if args == ["preload"]:
        print(f"gpu-check: {preload()}")
        return 0
    print("usage: python -m edgespec.bench.gpucheck junit REPORT.xml | preload | summary REPORT_DIR", file=sys.stderr)
    return 64


if __name__ == "__main__":
    raise SystemExit(main())
