"""scripts/gpu-check.sh: without an NVIDIA GPU it stops at once with one clear line (exit 2); `--plan`
on a faked Jetson (a device tree, no nvidia-smi), on a faked x86_64 GPU host (a fake nvidia-smi) and on
a machine with no GPU at all prints what it would run; a GPU wheel that cannot be installed leaves onnxruntime importable; it is
shellcheck-clean. (What it does on a GPU is tests/bench/test_gpu.py plus the report it writes.)"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "scripts" / "gpu-check.sh"


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
    r = run(tmp_path, path_with_nvidia_smi(tmp_path, "exit 9"))
    assert r.returncode == 2 and "nvidia-smi lists none" in r.stderr


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed (apt install shellcheck)")
def test_shellcheck_clean():
    r = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout


# --- --plan: what it would run, on faked hosts (nothing is run, nothing is written) ---------------
FAKES = Path(__file__).parents[1] / "fakes"
FLOOR = __import__("edgespec.models.kernels", fromlist=["ORT_FLOORS"]).ORT_FLOORS["cuda"]  # the oldest GPU wheel edgespec takes
STEPS = ("versions", "doctor", "test-gpu", "export-smollm2", "verify-", "placement-", "bench-", "plan-measure-")


def plan(tmp_path, *args, path=None, env=None):
    e = {**os.environ, "PATH": path or os.environ["PATH"], **(env or {})}
    return subprocess.run([shutil.which("bash") or "/bin/bash", str(SCRIPT), "--plan", "-o", str(tmp_path / "report"), *args],
                          capture_output=True, text=True, env=e, timeout=120)


def path_with_nvidia_smi(tmp_path, script: str, folder: str = "bin") -> str:
    """This PATH with a fake nvidia-smi (the shell `script`) in front."""
    bins = tmp_path / folder
    bins.mkdir(exist_ok=True)
    fake = bins / "nvidia-smi"
    fake.write_text("#!/bin/sh\n" + script + "\n")
    fake.chmod(0o755)
    return f"{bins}{os.pathsep}{os.environ['PATH']}"


def fake_nvidia_smi(tmp_path) -> str:
    """An x86_64 host with a discrete GPU: nvidia-smi lists one data-centre GPU."""
    return path_with_nvidia_smi(tmp_path, 'echo "NVIDIA H200, 143771 MiB, 550.54.15"')


def no_nvidia_smi_path(tmp_path) -> str:
    """An nvidia-smi that fails loudly if anything calls it (a Jetson must not need one)."""
    return path_with_nvidia_smi(tmp_path, "echo 'nvidia-smi was called' >&2; exit 97", "nosmi")


def test_plan_on_a_faked_jetson_uses_the_jetpack_index_and_runs_nothing(tmp_path):
    r = plan(tmp_path, "--root", str(FAKES / "jetson-orin-nano"), path=no_nvidia_smi_path(tmp_path))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "Jetson Orin Nano" in out and "L4T 36.4.3" in out
    assert f"install 'onnxruntime-gpu>={FLOOR}' --index-url https://pypi.jetson-ai-lab.io/jp6/cu126" in out
    assert "[cuda,cudnn]" not in out and "preload" not in out  # JetPack brings CUDA itself
    assert "uninstall" not in out
    assert "nvidia-smi was called" not in r.stderr
    for s in STEPS:
        assert f"[{s}" in out, s
    assert "export-qwen" not in out  # quick by default
    assert out.rstrip().endswith("# nothing was run (--plan)")
    assert not (tmp_path / "report").exists()


def test_plan_on_a_faked_x86_gpu_host_installs_the_wheel_with_cuda_extras_in_its_own_venv(tmp_path):
    import onnxruntime

    empty_root = tmp_path / "root"  # no device tree, no nv_tegra_release: not a Jetson
    empty_root.mkdir()
    r = plan(tmp_path, "--root", str(empty_root), "--full", path=fake_nvidia_smi(tmp_path))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    venv = tmp_path / "report" / "venv"
    assert "NVIDIA H200, 143771 MiB" in out
    assert f"-m venv --without-pip {venv}" in out
    assert f"-m pip --python {venv}/bin/python install 'onnxruntime-gpu[cuda,cudnn]=={onnxruntime.__version__}'" in out
    assert f"install 'onnxruntime-gpu[cuda,cudnn]>={FLOOR}')" in out  # the fallback: the newest at the floor or above
    assert "preload_dlls()" in out
    assert "uninstall" not in out
    # every step runs with the venv's python, and --full adds the Qwen pair and the chat prompts
    assert f"[doctor, 120s] {venv}/bin/python -m edgespec doctor --json" in out
    assert "[export-qwen" in out and "-chat," in out and "-qwen-coder-cuda" in out
    assert not (tmp_path / "report").exists()


def test_plan_on_a_jetpack5_jetson_asks_for_the_wheel_and_takes_it(tmp_path):
    root = str(FAKES / "jetson-agx-orin")  # L4T R35: JetPack 5
    r = plan(tmp_path, "--root", root, path=no_nvidia_smi_path(tmp_path))
    assert r.returncode == 2
    assert "L4T 35.4.1 (not JetPack 6)" in r.stderr and "--ort-wheel FILE" in r.stderr
    assert "JetPack 5 (Python 3.8) is not supported" in r.stderr and f"onnxruntime-gpu >= {FLOOR}" in r.stderr
    wheel = tmp_path / "onnxruntime_gpu-1.23.0-cp311-cp311-linux_aarch64.whl"
    wheel.write_bytes(b"")
    r = plan(tmp_path, "--root", root, "--ort-wheel", str(wheel), path=no_nvidia_smi_path(tmp_path))
    assert r.returncode == 0, r.stderr
    assert f"install {wheel}" in r.stdout
    r = plan(tmp_path, "--root", root, "--ort-wheel", str(tmp_path / "missing.whl"))
    assert r.returncode == 2 and "no such file" in r.stderr


def test_a_missing_gpu_wheel_stops_the_check_and_leaves_onnxruntime_importable(tmp_path):
    """No index, no wheel: the install into the check's own venv fails; this python is untouched."""
    import onnxruntime

    before = Path(onnxruntime.__file__).stat().st_mtime_ns
    empty_root, links = tmp_path / "root", tmp_path / "links"
    empty_root.mkdir()
    links.mkdir()
    e = {**os.environ, "PATH": fake_nvidia_smi(tmp_path), "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(links),
         "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    r = subprocess.run([shutil.which("bash") or "/bin/bash", str(SCRIPT), "-o", str(tmp_path / "report"), "--root",
                        str(empty_root)], capture_output=True, text=True, env=e, timeout=300)
    assert r.returncode == 3, r.stderr
    # the same version as onnxruntime was tried first, then the newest at or above the floor
    assert f"could not install onnxruntime-gpu[cuda,cudnn]>={FLOOR}" in r.stderr and "were not changed" in r.stderr
    log = (tmp_path / "report" / "logs" / "install.log").read_text()
    assert "No matching distribution found for onnxruntime-gpu" in log
    assert not (tmp_path / "report" / "summary.md").exists()  # no step ran
    # the check's venv sees this one's packages (the wheel would have gone in front of them)
    v = subprocess.run([str(tmp_path / "report" / "venv" / "bin" / "python"), "-c", "import onnxruntime, numpy, edgespec"],
                       capture_output=True, text=True, timeout=120)
    assert v.returncode == 0, v.stderr
    p = subprocess.run([sys.executable, "-c", "import onnxruntime; print(onnxruntime.__version__)"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == onnxruntime.__version__
    assert Path(onnxruntime.__file__).stat().st_mtime_ns == before


def test_on_a_jetson_a_failed_install_names_nvidias_wheels_and_ort_wheel(tmp_path):
    links = tmp_path / "links"
    links.mkdir()
    e = {**os.environ, "PATH": no_nvidia_smi_path(tmp_path), "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(links),
         "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    r = subprocess.run([shutil.which("bash") or "/bin/bash", str(SCRIPT), "-o", str(tmp_path / "report"), "--root",
                        str(FAKES / "jetson-orin-nano")], capture_output=True, text=True, env=e, timeout=300)
    assert r.returncode == 3, r.stderr
    assert f"could not install onnxruntime-gpu>={FLOOR} --index-url https://pypi.jetson-ai-lab.io/jp6/cu126" in r.stderr
    assert "pass it with --ort-wheel FILE" in r.stderr and "were not changed" in r.stderr


def test_with_a_pip_older_than_22_3_the_venv_gets_its_own_pip(tmp_path):
    """Ubuntu 22.04's pip (JetPack 6) has no --python: the venv is made with pip and pip runs inside it."""
    wrapper = tmp_path / "oldpip-python"
    wrapper.write_text(f'#!/bin/sh\nif [ "$1 $2 $3" = "-m pip --help" ]; then echo "  --proxy <proxy>"; exit 0; fi\n'
                       f'exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    root = tmp_path / "root"
    root.mkdir()
    r = plan(tmp_path, "--root", str(root), path=fake_nvidia_smi(tmp_path), env={"PYTHON": str(wrapper)})
    assert r.returncode == 0, r.stderr
    venv = tmp_path / "report" / "venv"
    assert f"{wrapper} -m venv {venv}\n" in r.stdout and "--without-pip" not in r.stdout
    assert f"{venv}/bin/python -m pip install 'onnxruntime-gpu[cuda,cudnn]==" in r.stdout


def test_relative_paths_are_taken_from_the_callers_folder(tmp_path):
    """The steps run in the checkout: a relative -o or bundle must still mean the caller's folder."""
    root = tmp_path / "root"
    root.mkdir()
    e = {**os.environ, "PATH": fake_nvidia_smi(tmp_path)}
    r = subprocess.run([shutil.which("bash") or "/bin/bash", str(SCRIPT), "--plan", "-o", "rel/report", "--smollm2",
                        "bundles/smol", "--root", str(root)], capture_output=True, text=True, env=e, timeout=120,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"verify --load {tmp_path}/bundles/smol" in r.stdout and f" {tmp_path}/rel/report/venv\n" in r.stdout
    assert not (tmp_path / "rel").exists()


def test_plan_on_a_machine_without_any_gpu_prints_the_plan(tmp_path):
    """No nvidia-smi, no Jetson tree: --plan still says what an x86_64 GPU host would run, exit 0."""
    empty_root = tmp_path / "root"
    empty_root.mkdir()
    bins = tmp_path / "bin"
    bins.mkdir()
    keep = [d for d in os.environ["PATH"].split(os.pathsep) if not (Path(d) / "nvidia-smi").exists()]
    r = plan(tmp_path, "--root", str(empty_root), path=os.pathsep.join([str(bins), *keep]))
    assert r.returncode == 0, r.stderr
    assert "GPU: none found (--plan: what an x86_64 GPU host would run)" in r.stdout
    assert f"'onnxruntime-gpu[cuda,cudnn]>={FLOOR}'" in r.stdout and "[versions, 60s]" in r.stdout
    assert r.stdout.rstrip().endswith("# nothing was run (--plan)") and not (tmp_path / "report").exists()


def test_the_import_check_sees_the_checkout_and_needs_no_onnxruntime(tmp_path):
    """A python that finds numpy and tokenizers but neither edgespec nor onnxruntime on its own (no
    site hooks: the editable install's finder is not run): the check reads this checkout through
    PYTHONPATH, set before it, and the floor from kernels.py without importing edgespec."""
    import sysconfig

    import numpy

    site = tmp_path / "site"
    site.mkdir()
    for mod in ("numpy", "tokenizers"):
        src = Path(__import__(mod).__file__).parent
        (site / mod).symlink_to(src)
    for libs in Path(numpy.__file__).parents[1].glob("numpy.libs"):
        (site / libs.name).symlink_to(libs)
    wrapper = tmp_path / "bare-python"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{site}" exec {sys.executable} -S "$@"\n')
    wrapper.chmod(0o755)
    probe = subprocess.run([str(wrapper), "-c", "import numpy, tokenizers; import importlib.util as u; "
                            "print(u.find_spec('edgespec'), u.find_spec('onnxruntime'))"], capture_output=True,
                           text=True, timeout=60, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
                           cwd=tmp_path)
    assert probe.returncode == 0 and probe.stdout.strip() == "None None", (probe.stdout, probe.stderr, sysconfig)
    root = tmp_path / "root"
    root.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([shutil.which("bash") or "/bin/bash", str(SCRIPT), "--plan", "-o", str(tmp_path / "report"),
                        "--root", str(root)], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env={**env, "PYTHON": str(wrapper), "PATH": fake_nvidia_smi(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert f"'onnxruntime-gpu[cuda,cudnn]>={FLOOR}'" in r.stdout  # no onnxruntime here: the floor is the spec
