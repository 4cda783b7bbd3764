"""systemd/jetson.Dockerfile (docs/jetson.md): it parses, its base is NVIDIA's l4t-jetpack image for L4T r36.4
(the CUDA 12.6 that NVIDIA's onnxruntime-gpu >= 1.23 is built for), its pip lines hold edgespec's floors, fetch
the GPU wheel from NVIDIA's index alone and never install the CPU onnxruntime, edgespec's own lines resolve for
cp310 aarch64, and the sources it copies build the runtime. (The image itself is built on a Jetson, not here.)"""
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


def _pip_installs(verbs=("install",)) -> list[list[str]]:
    """The words after each `pip install` (or another verb) of the RUN lines, ${VAR}s filled from the ARGs."""
    args = _args()
    out = []
    for op, a in _instructions():
        if op != "RUN":
            continue
        for cmd in a.split("&&"):
            words = shlex.split(re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), cmd))
            if "pip" in " ".join(words[:1]) and words[1:2] and words[1] in verbs:
                out.append(words[2:])
    return out


DOCKERFILE_INSTRUCTIONS = {"FROM", "ARG", "ENV", "RUN", "COPY", "ADD", "WORKDIR", "EXPOSE", "ENTRYPOINT", "CMD",
                           "LABEL", "USER", "VOLUME", "SHELL", "HEALTHCHECK", "STOPSIGNAL", "ONBUILD"}


def test_the_recipe_parses():
    """Every line is a Dockerfile instruction, only ARGs precede the one FROM, every ${VAR} is an ARG or ENV set
    before it, and the exec-form lines are JSON arrays."""
    import json

    ins = _instructions()
    assert {op for op, _ in ins} <= DOCKERFILE_INSTRUCTIONS, {op for op, _ in ins} - DOCKERFILE_INSTRUCTIONS
    first_from = [op for op, _ in ins].index("FROM")
    assert all(op == "ARG" for op, _ in ins[:first_from]) and [op for op, _ in ins].count("FROM") == 1
    known = {"PATH", "LD_LIBRARY_PATH"}
    for op, a in ins:
        used = set(re.findall(r"\$\{(\w+)\}", a))
        assert used <= known, (op, a, used - known)
        if op in ("ARG", "ENV"):
            known |= {w.split("=", 1)[0] for w in shlex.split(a)}
        if op in ("ENTRYPOINT", "CMD"):
            assert isinstance(json.loads(a), list)


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


def test_the_base_is_nvidias_l4t_jetpack_image_for_r36_4():
    args = _args()
    assert args["BASE_IMAGE"] == "nvcr.io/nvidia/l4t-jetpack:r36.4.0" and ("FROM", "${BASE_IMAGE}") in _instructions()
    # JetPack 6.1/6.2: CUDA 12.6, what NVIDIA's onnxruntime-gpu >= 1.23 (the cuda floor) is built for; not r36.3
    assert "r36.4" in args["BASE_IMAGE"] and "12-6" not in RECIPE.read_text()  # no apt CUDA packages to mismatch


def test_onnxruntime_gpu_comes_alone_from_nvidias_jetpack6_index_at_the_cuda_floor():
    index = re.search(r"https://\S+/jp6/cu126", JETSON_WHEELS).group()
    assert _args()["ORT_INDEX"] == index
    (ort,) = [w for w in _pip_installs(("download",)) if any(x.startswith("onnxruntime-gpu") for x in w)]
    req = Requirement(next(x for x in ort if x.startswith("onnxruntime-gpu")))
    floor = ORT_FLOORS["cuda"]
    assert req.specifier.contains(floor) and req.specifier.contains("1.24.0")  # NVIDIA's two JetPack 6 wheels
    assert not req.specifier.contains("1.22.1")
    # --index-url, not --extra-index-url: PyPI's aarch64 onnxruntime-gpu wheels are SBSA builds that fail on Orin
    assert ort[ort.index("--index-url") + 1] == index and "--no-deps" in ort and "--extra-index-url" not in ort
    assert ["/tmp/ort-gpu/onnxruntime_gpu-*.whl"] in _pip_installs()


def test_edgespec_is_installed_after_it_without_the_cpu_onnxruntime():
    installs = _pip_installs()
    names = [Requirement(w).name for ws in installs for w in _requirements(ws) if not w.startswith("/")]
    assert "onnxruntime" not in names
    srcs = [w for ws in installs for w in ws if w.startswith("/opt/edgespec/src")]
    assert srcs == ["/opt/edgespec/src[server]", "/opt/edgespec/src/export"]  # no [cpu]; the export half needs none
    order = [i for i, ws in enumerate(installs) for w in ws if w.startswith(("/tmp/ort-gpu", "/opt/edgespec/src"))]
    # the GPU wheel first: nothing can pull the CPU one then
    assert order == sorted(order) and installs[order[0]][0].startswith("/tmp/ort-gpu") and len(set(order)) == 2


@pytest.mark.slow
def test_edgespecs_pip_line_resolves_for_cp310_aarch64_without_onnxruntime(tmp_path):
    """The recipe's edgespec line, with the wheels its sources build, for JetPack 6's Python and glibc
    (scripts/board_resolve.py; needs the package registry; the onnxruntime-gpu line is NVIDIA's index's)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import board_resolve

    try:
        wheels = board_resolve.build_wheels(ROOT, tmp_path / "wheels")
    except subprocess.CalledProcessError as e:
        pytest.skip(f"cannot build the wheels here: {e.stderr[-300:]}")
    (line,) = [ws for ws in _pip_installs() if any(w.startswith("/opt/edgespec/src") for w in ws)]
    reqs = [str(wheels["edgespec-export"]) if w.endswith("/export") else str(wheels["edgespec"]) + w[len("/opt/edgespec/src"):]
            for w in _requirements(line)]
    try:
        found = board_resolve.resolve("3.10", 35, reqs)
    except board_resolve.ResolveError as e:
        if "NewConnectionError" in str(e) or "Could not fetch URL" in str(e):
            pytest.skip(f"no package registry: {str(e)[:200]}")
        raise
    assert "uvicorn" in found and "edgespec-export" in found and not [n for n in found if n.startswith("onnxruntime")]


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
