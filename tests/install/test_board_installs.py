"""No install path puts PyPI's CPU onnxruntime on a Jetson (it owns the same `onnxruntime` module as NVIDIA's
onnxruntime-gpu and would replace it): the export half requires none, and scripts/setup-env.sh (what
scripts/quickstart.sh runs) leaves the `cpu` extra out on a board with /etc/nv_tegra_release. The slow tests
resolve those installs with pip for the boards' own Python and glibc tags (scripts/board_resolve.py: binary wheels
only, nothing installed; they need the package registry)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import board_resolve  # noqa: E402

JETPACK_6 = "# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64\n"


def _plan(tmp_path, tegra: str | None, **env) -> list[str]:
    """setup-env.sh's plan (EDGESPEC_SETUP_PLAN=1): its first line says what it found, then one pip argument a line."""
    release = tmp_path / "nv_tegra_release"
    if tegra is not None:
        release.write_text(tegra)
    r = subprocess.run(["bash", str(ROOT / "scripts/setup-env.sh")], capture_output=True, text=True, timeout=60,
                       env=os.environ | {"EDGESPEC_SETUP_PLAN": "1", "EDGESPEC_TEGRA_RELEASE": str(release),
                                         "EDGESPEC_VENV": str(tmp_path / "venv"), "PYTHON": sys.executable, **env})
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def test_the_export_half_requires_edgespec_without_its_cpu_extra():
    tomllib = pytest.importorskip("tomllib")
    deps = tomllib.loads((ROOT / "export/pyproject.toml").read_text())["project"]["dependencies"]
    assert "edgespec" in deps and not [d for d in deps if "onnxruntime" in d or "[cpu]" in d], deps


def test_setup_env_on_a_jetson_leaves_the_cpu_onnxruntime_out_and_says_so(tmp_path):
    lines = _plan(tmp_path, JETPACK_6)
    assert lines[0].startswith("gpu_board=1 l4t=36.4.3 ")
    assert lines[1:] == [f"-e {ROOT}[server,plot,test]", f"-e {ROOT}/export"]
    assert _plan(tmp_path, JETPACK_6, EXTRAS="server,cpu")[1] == f"-e {ROOT}[server]"


def test_setup_env_elsewhere_keeps_all_extras(tmp_path):
    lines = _plan(tmp_path, None)
    assert lines[0].startswith("gpu_board=0 l4t=none ") and lines[1] == f"-e {ROOT}[all]"


def test_setup_env_refuses_the_torch_extra_on_a_jetson_in_one_line(tmp_path):
    release = tmp_path / "nv_tegra_release"
    release.write_text(JETPACK_6)
    r = subprocess.run(["bash", str(ROOT / "scripts/setup-env.sh")], capture_output=True, text=True, timeout=60,
                       env=os.environ | {"EDGESPEC_SETUP_PLAN": "1", "EDGESPEC_TEGRA_RELEASE": str(release),
                                         "EXPORT": "torch", "PYTHON": sys.executable})
    assert r.returncode == 1 and "EXPORT=torch is not for a GPU board" in r.stderr and r.stdout == ""


def test_platforms_cover_the_board_glibc_down_to_manylinux2014():
    tags = board_resolve.platforms(35)
    assert tags[0] == "manylinux_2_35_aarch64" and "manylinux_2_28_aarch64" in tags
    assert tags[-2:] == ["manylinux_2_17_aarch64", "manylinux2014_aarch64"] and len(tags) == 35 - 17 + 2
    assert [b[1:] for b in board_resolve.BOARDS] == [("3.10", 35), ("3.11", 36), ("3.12", 39), ("3.13", 41)]


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    try:
        return board_resolve.build_wheels(ROOT, tmp_path_factory.mktemp("wheels"))
    except subprocess.CalledProcessError as e:
        pytest.skip(f"cannot build the wheels here (no package registry for setuptools?): {e.stderr[-300:]}")


def _resolve(*reqs: str) -> dict[str, str]:
    try:
        return board_resolve.resolve("3.10", 35, list(reqs))
    except board_resolve.ResolveError as e:
        if "NewConnectionError" in str(e) or "Could not fetch URL" in str(e):
            pytest.skip(f"no package registry: {str(e)[:200]}")
        raise


@pytest.mark.slow
def test_the_export_half_resolves_for_jetpack6_python_without_onnxruntime(wheels):
    found = _resolve(str(wheels["edgespec"]), str(wheels["edgespec-export"]))
    assert "edgespec-export" in found and "onnx" in found and "gguf" in found
    assert not [n for n in found if n.startswith("onnxruntime")], found


@pytest.mark.slow
def test_the_quickstart_install_on_a_jetson_resolves_without_onnxruntime(wheels, tmp_path):
    reqs = []
    for line in _plan(tmp_path, JETPACK_6)[1:]:
        path = line.removeprefix("-e ")
        extras = path[path.index("["):] if "[" in path else ""
        reqs.append(str(wheels["edgespec-export"] if path.split("[")[0].endswith("/export") else wheels["edgespec"]) + extras)
    found = _resolve(*reqs)
    assert "starlette" in found and "pytest" in found and "edgespec-export" in found
    assert not [n for n in found if n.startswith("onnxruntime")], found
    # and what the old requirement did: the CPU wheel, pulled for the same board
    assert "onnxruntime" in _resolve(f"{wheels['edgespec']}[cpu]")
