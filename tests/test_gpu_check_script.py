"""scripts/gpu-check.sh: without an NVIDIA GPU it stops at once with one clear line (exit 2), and it
is shellcheck-clean. (What it does on a GPU is tests/test_gpu.py plus the report it writes.)"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent.parent / "scripts" / "gpu-check.sh"


def run(tmp_path, path: str):
    env = {**os.environ, "PATH": path}
    return subprocess.run([shutil.which("bash") or "/bin/bash", str(SCRIPT), "-o", str(tmp_path / "report")], capture_output=True, text=True,
                          env=env, timeout=60)


def test_without_nvidia_smi_it_says_so_and_writes_nothing(tmp_path):
    bins = tmp_path / "bin"
    bins.mkdir()
    for tool in ("uname", "date", "dirname", "sed", "cat"):
        found = shutil.which(tool)
        if found:
            (bins / tool).symlink_to(found)
    r = run(tmp_path, str(bins))
    assert r.returncode == 2
    assert "no NVIDIA GPU here: nvidia-smi is not installed" in r.stderr
    assert not (tmp_path / "report").exists()


def test_an_nvidia_smi_that_lists_no_gpu_is_refused_too(tmp_path):
    bins = tmp_path / "bin"
    bins.mkdir()
    fake = bins / "nvidia-smi"
    fake.write_text("#!/bin/sh\nexit 9\n")
    fake.chmod(0o755)
    r = run(tmp_path, f"{bins}{os.pathsep}{os.environ['PATH']}")
    assert r.returncode == 2 and "nvidia-smi lists none" in r.stderr


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed (apt install shellcheck)")
def test_shellcheck_clean():
    r = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout
