"""The Python half of scripts/gpu-check.sh: what bash is poor at.

    python -m edgespec.bench.gpucheck junit REPORT.xml    # exit 0 only when some test really ran and passed
    python -m edgespec.bench.gpucheck preload             # onnxruntime.preload_dlls(), saying what it did

Why `junit`: pytest exits 0 when every test skipped, and tests/test_gpu.py skips everything where the
CUDA provider does not work; a GPU check that records that as passed says the GPU path works when
nothing ran on the GPU. The JUnit XML that pytest writes counts tests, skips, failures and errors.

Why `preload`: onnxruntime-gpu from PyPI finds the CUDA and cuDNN libraries that its `[cuda,cudnn]`
extras install (the nvidia-* wheels) only when they are loaded before the first CUDA session
(`onnxruntime.preload_dlls()`, onnxruntime >= 1.21). edgespec's own sessions do it
(edge/providers.py); the check's venv does it at every start too, for code that opens sessions itself.
"""
from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass


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


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 2 and args[0] == "junit":
        try:
            ok, line = junit_counts(args[1]).verdict()
        except (OSError, ET.ParseError) as e:
            ok, line = False, f"no readable JUnit report at {args[1]}: {e}"
        print(f"gpu-check: {line}")
        return 0 if ok else 5
    if args == ["preload"]:
        print(f"gpu-check: {preload()}")
        return 0
    print("usage: python -m edgespec.bench.gpucheck junit REPORT.xml | preload", file=sys.stderr)
    return 64


if __name__ == "__main__":
    raise SystemExit(main())
