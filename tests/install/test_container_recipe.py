"""systemd/jetson.Dockerfile (docs/jetson.md): its pip lines hold edgespec's floors and never install
the CPU onnxruntime, its base is what jetson-containers builds JetPack 6 images on, and the sources it
copies are enough to build the runtime. (The image itself is built on a Jetson, not here.)"""
from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from edgespec.models.kernels import JETSON_WHEELS, ORT_FLOORS

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "systemd" / "jetson.Dockerfile"


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", "\n".join(ln for ln in RECIPE.read_text().splitlines() if not ln.lstrip().startswith("#")))
    return [(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1] if " " in ln.strip() else "")
            for ln in text.splitlines() if ln.strip()]


def _args() -> dict[str, str]:
    return dict(a.split("=", 1) for op, a in _instructions() if op == "ARG" and "=" in a)


def _pip_installs() -> list[list[str]]:
    """The words after each `pip install` of the RUN lines, ${VAR}s filled from the ARGs."""
    args = _args()
    out = []
    for op, a in _instructions():
        if op != "RUN":
            continue
        for cmd in a.split("&&"):
            words = shlex.split(re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), cmd))
            if "pip" in " ".join(words[:1]) and words[1:2] == ["install"]:
                out.append(words[2:])
    return out


def _requirements(words: list[str]) -> list[str]:
    """The requirement arguments of one pip install (options and their values left out)."""
    out, skip = [], False
    for w in words:
        if skip:
            skip = False
        elif w.startswith("-"):
            skip = w in ("--extra-index-url", "--index-url", "-i", "--find-links", "-f", "-c", "-r")
        else:
            out.append(w)
    return out


def test_the_base_is_ubuntu_22_04_with_cuda_added_as_jetson_containers_does():
    args = _args()
    assert args["BASE_IMAGE"] == "ubuntu:22.04" and ("FROM", "${BASE_IMAGE}") in _instructions()
    assert args["L4T_RELEASE"].startswith("r36.")  # JetPack 6; JetPack 5 (r35, Python 3.8) is not supported
    assert "repo.download.nvidia.com/jetson" in RECIPE.read_text() and "libcudnn9" in RECIPE.read_text()


def test_onnxruntime_gpu_comes_from_nvidias_jetpack6_index_at_the_cuda_floor():
    index = re.search(r"https://\S+/jp6/cu126", JETSON_WHEELS).group()
    assert _args()["ORT_INDEX"] == index
    (ort,) = [w for w in _pip_installs() if any(x.startswith("onnxruntime-gpu") for x in w)]
    req = Requirement(next(x for x in ort if x.startswith("onnxruntime-gpu")))
    floor = ORT_FLOORS["cuda"]
    assert req.specifier.contains(floor) and req.specifier.contains("1.24.0")  # NVIDIA's two JetPack 6 wheels
    assert not req.specifier.contains("1.22.1")
    assert ort[ort.index("--extra-index-url") + 1] == index


def test_edgespec_is_installed_after_it_without_the_cpu_onnxruntime():
    installs = _pip_installs()
    names = [Requirement(w).name for ws in installs for w in _requirements(ws) if not w.startswith("/")]
    assert "onnxruntime" not in names
    (src,) = [w for ws in installs for w in ws if w.startswith("/opt/edgespec/src")]
    assert src == "/opt/edgespec/src[server]"  # no [cpu]
    order = [i for i, ws in enumerate(installs) for w in ws if w.startswith(("onnxruntime-gpu", "/opt/edgespec/src"))]
    assert order == sorted(order) and len(order) == 2  # the GPU wheel first: nothing can pull the CPU one then


def test_the_copied_sources_build_the_runtime(tmp_path):
    """The recipe's COPY lines, laid out as in the image, build edgespec's wheel (devices/ included)."""
    dest = tmp_path / "src"
    dest.mkdir()
    for op, a in _instructions():
        if op != "COPY":
            continue
        *srcs, target = a.split()
        for s in srcs:
            to = dest / Path(target).relative_to("/opt/edgespec/src") if not target.endswith("/") else dest / s
            if (ROOT / s).is_dir():
                shutil.copytree(ROOT / s, to, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy(ROOT / s, to)
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                        str(tmp_path / "dist"), str(dest)], capture_output=True, text=True, timeout=300)
    if r.returncode != 0 and "setuptools" in r.stderr:
        pytest.skip("setuptools is not in this venv (the wheel is built in scripts/ci-ort.sh)")
    assert r.returncode == 0, r.stderr
    import zipfile

    (wheel,) = (tmp_path / "dist").glob("edgespec-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "edgespec/devices/jetson-orin-nano-8gb.json" in names and "edgespec/__init__.py" in names


def test_the_board_pages_name_the_floors_and_the_right_install():
    """docs/jetson.md and docs/edge.md ask for the cuda floor from NVIDIA's index and never install the
    CPU wheel beside it; docs/raspberry-pi.md installs the cpu extra."""
    floor = ORT_FLOORS["cuda"]
    jetson = (ROOT / "docs/jetson.md").read_text()
    for page in (jetson, (ROOT / "docs/edge.md").read_text()):
        asked = re.findall(r"onnxruntime-gpu(?:\[[a-z,]+\])?>=([0-9.]+)", page)
        assert asked and set(asked) == {floor}, asked
    assert "https://pypi.jetson-ai-lab.io/jp6/cu126" in jetson and "JetPack 5 is not supported" in jetson
    installs = re.findall(r"pip install '([^']+)'", jetson)
    assert "./edgespec[server]" in installs and not [i for i in installs if "cpu" in i], installs
    pi = (ROOT / "docs/raspberry-pi.md").read_text()
    assert "pip install './edgespec[cpu,server]'" in pi and "Bookworm" in pi and "Python 3.11" in pi
