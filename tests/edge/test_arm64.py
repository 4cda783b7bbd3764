"""The device runtime on aarch64: scripts/test-arm64.sh runs the tests marked `arm64` inside an
emulated arm64 Debian (qemu user mode). The first test runs there and proves where it runs; the
slow one drives the script from the x86_64 side."""
from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "test-arm64.sh"


@pytest.mark.arm64
@pytest.mark.skipif(not os.environ.get("EDGESPEC_ARM64"), reason="only inside scripts/test-arm64.sh")
def test_really_running_on_aarch64():
    import numpy as np
    import onnxruntime as ort

    from edgespec.edge import devices
    from edgespec.edge.providers import probe

    assert platform.machine() == "aarch64"
    assert devices.detect().arch == "aarch64"
    cpu = [r for r in probe("cpu")][0]
    assert cpu.works, cpu.error
    assert "CPUExecutionProvider" in ort.get_available_providers()
    assert np.dtype(np.float32).itemsize == 4


def _can_emulate() -> str | None:
    if os.geteuid() != 0:
        return "needs root (chroot, binfmt_misc)"
    if not shutil.which("apt-get") and not shutil.which("qemu-aarch64-static"):
        return "no apt-get to install qemu-user-static"
    return None


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_runtime_tests_pass_on_emulated_aarch64():
    why = _can_emulate()
    if why:
        pytest.skip(why)
    files = ["tests/edge/test_arm64.py", "tests/core/test_runner.py", "tests/test_lossless.py", "tests/core/test_sampling.py"]
    selection = [*files, "-m", "arm64 and not slow"]
    # the tests whose outcome rests on the machine's arithmetic and native code (the `arm64` marker): the runner's
    # cache, greedy and sampled losslessness alone and in batched rows, grammars. The rest of the suite is the same
    # Python on any machine, and runs natively.
    p = subprocess.run(
        [str(SCRIPT), *selection], cwd=ROOT, capture_output=True, text=True, timeout=3500,
        # this python (the venv the suite runs in, which has the export extra) builds the tiny bundles
        env={**os.environ, "PYTHON": os.environ.get("PYTHON", sys.executable)},
    )
    out = p.stdout + p.stderr
    # the tiny bundles' quantizer logs a line per matrix: left out, so a failure's own lines fit the message
    said = "\n".join(x for x in out.splitlines() if "matmul_nbits_quantizer" not in x)
    assert p.returncode == 0, said[-6000:]
    assert "only inside scripts/test-arm64.sh" not in out  # the aarch64 check ran, it did not skip
    # every marked test ran there (passed, or skipped for a reason the guest states), none went missing
    here = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *selection],
                          cwd=ROOT, capture_output=True, text=True, timeout=300).stdout
    marked = int(re.search(r"(\d+)(?:/\d+)? tests? collected", here).group(1))
    ran = re.findall(r"(\d+) passed(?:, (\d+) skipped)?", out)  # the guest's summary is the last
    assert ran and int(ran[-1][0]) + int(ran[-1][1] or 0) == marked, (marked, said[-3000:])
