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


def test_the_export_half_requires_neither_a_pypi_edgespec_nor_an_onnxruntime():
    """`pip install ./export` must resolve alone: no requirement on the PyPI name `edgespec` (not this project's)."""
    tomllib = pytest.importorskip("tomllib")
    deps = tomllib.loads((ROOT / "export/pyproject.toml").read_text())["project"]["dependencies"]
    names = [d.split(";")[0].split("[")[0].split("=")[0].split(">")[0].split("<")[0].strip().lower() for d in deps]
    assert "edgespec" not in names and not [n for n in names if n.startswith("onnxruntime")], names
    assert "onnx" in names and "gguf" in names


def test_the_export_half_without_the_runtime_is_one_line_at_import():
    # -S and a path holding only the export half: no runtime anywhere
    r = subprocess.run([sys.executable, "-S", "-c", "import edgespec_export"], capture_output=True, text=True,
                       timeout=60, env={"PYTHONPATH": str(ROOT / "export"), "PATH": os.environ.get("PATH", "")},
                       cwd=str(ROOT / "export"))
    assert r.returncode == 1, r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        "ImportError: edgespec-export needs the edgespec runtime from the same checkout: pip install . ./export (from "
        "the repository root; on a Jetson add '[server]' to '.', never '[cpu]': docs/jetson.md)")


def test_setup_env_on_a_jetson_leaves_the_cpu_onnxruntime_out_and_says_so(tmp_path):
    lines = _plan(tmp_path, JETPACK_6)
    assert lines[0].startswith("gpu_board=1 l4t=36.4.3 jetpack=6.2 onnxruntime=jp6-cu126 ")
    assert lines[1:] == [f"-e {ROOT}[server,plot,test]", f"-e {ROOT}/export"]
    assert _plan(tmp_path, JETPACK_6, EXTRAS="server,cpu")[1] == f"-e {ROOT}[server]"


def test_setup_env_elsewhere_keeps_all_extras(tmp_path):
    lines = _plan(tmp_path, None)
    assert lines[0].startswith("gpu_board=0 l4t=none jetpack=none onnxruntime=pypi-cpu ")
    assert lines[1] == f"-e {ROOT}[all]"


def _release(major: int, revision: str) -> str:
    return f"# R{major} (release), REVISION: {revision}, GCID: 1, BOARD: generic, EABI: aarch64, DATE: x\n"


@pytest.mark.parametrize("tegra, l4t, jetpack, source", [
    (_release(36, "3.0"), "36.3.0", "6.0", "upgrade"),      # CUDA 12.2: no wheel at the floor
    (_release(36, "4.4"), "36.4.4", "6.2.1", "jp6-cu126"),
    (_release(36, "5.0"), "36.5.0", "6.2.2", "jp6-cu126"),  # JetPack 6.2.2
    (_release(36, "6.1"), "36.6.1", "6.2.2+", "jp6-cu126"),  # any later r36.x: read as r36.5.0's row
    (_release(39, "2"), "39.2", "7.2", "none"),             # JetPack 7.2 on Orin: no wheel with sm_87 kernels known
    (_release(35, "6.1"), "35.6.1", "5", "unsupported"),
])
def test_setup_env_takes_the_onnxruntime_source_of_the_boards_jetpack_row(tmp_path, tegra, l4t, jetpack, source):
    lines = _plan(tmp_path, tegra)
    assert lines[0].startswith(f"gpu_board=1 l4t={l4t} jetpack={jetpack} onnxruntime={source} "), lines[0]
    assert lines[1] == f"-e {ROOT}[server,plot,test]"  # never the CPU onnxruntime on a Jetson


def test_setup_env_fetches_nvidias_wheel_only_where_the_row_says_and_says_why_not_elsewhere(tmp_path):
    """The install step itself, with pip replaced by a recorder (nothing is fetched): r36.5.0 fetches the wheel from
    NVIDIA's index alone; r39.2 installs nothing and says why in its line."""
    from edgespec.edge import releases

    fake = tmp_path / "bin"
    fake.mkdir()
    log = tmp_path / "pip.log"
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin/python").write_text(f"#!/bin/sh\necho \"$@\" >> {log}\ncase \"$*\" in *onnxruntime*get_available*) exit 1;; esac\nexit 0\n")
    (venv / "bin/python").chmod(0o755)
    src = releases.table()["onnxruntime"]["jp6-cu126"]
    for revision, major, want in (("5.0", 36, f"download -q --no-deps -d /tmp/ort-gpu {src['requirement']} --index-url {src['index']}"),
                                  ("2", 39, None)):
        log.write_text("")
        release = tmp_path / "nv_tegra_release"
        release.write_text(_release(major, revision))
        r = subprocess.run(["bash", str(ROOT / "scripts/setup-env.sh")], capture_output=True, text=True, timeout=60,
                           env=os.environ | {"EDGESPEC_TEGRA_RELEASE": str(release), "EDGESPEC_VENV": str(venv),
                                             "PYTHON": sys.executable, "EXPORT": "0", "EXTRAS": "server"})
        assert r.returncode == 0, r.stderr
        calls = log.read_text()
        if want:
            assert want in calls and "NVIDIA's onnxruntime-gpu for JetPack 6.2.2" in r.stderr, (calls, r.stderr)
        else:
            assert "ort-gpu" not in calls and "--index-url" not in calls, calls
            assert "L4T 39.2 (JetPack 7.2): no onnxruntime-gpu checked for this release" in r.stderr, r.stderr
            assert "sm_87" in r.stderr
        (venv / ".edgespec-installed").unlink()


def test_setup_env_and_quickstart_refuse_python_3_8_in_one_line_before_pip_runs(tmp_path):
    py38 = tmp_path / "python3.8"  # answers as JetPack 5's Python would: too old, "3.8"
    py38.write_text('#!/bin/sh\ncase "$2" in *print*) echo "Python 3.8"; exit 0;; esac\nexit 1\n')
    py38.chmod(0o755)
    for script, plan in (("setup-env.sh", "1"), ("setup-env.sh", "0"), ("quickstart.sh", "0")):
        r = subprocess.run(["bash", str(ROOT / "scripts" / script)], capture_output=True, text=True, timeout=60,
                           env=os.environ | {"EDGESPEC_SETUP_PLAN": plan, "EDGESPEC_VENV": str(tmp_path / "venv"),
                                             "PYTHON": str(py38)})
        assert r.returncode == 1 and r.stdout == "", r.stdout
        assert r.stderr == (f"[setup] edgespec needs Python 3.10 or newer; {py38} is Python 3.8 (JetPack 5 and older "
                            "ship 3.8: flash JetPack 6.2.2; or PYTHON=python3.11 names another)\n"), r.stderr
        assert not (tmp_path / "venv").exists()


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
    # from the release table: JetPack 7.2 (Orin, Ubuntu 24.04) is the 3.12 row, JetPack 5 (3.8) is none
    assert [b[0] for b in board_resolve.BOARDS] == ["JetPack 6.0..6.2.2", "Raspberry Pi OS bookworm", "JetPack 7.0..7.2",
                                                     "Raspberry Pi OS trixie"]


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    try:
        return board_resolve.build_wheels(ROOT, tmp_path_factory.mktemp("wheels"))
    except subprocess.CalledProcessError as e:
        pytest.skip(f"cannot build the wheels here (no package registry for setuptools?): {e.stderr[-300:]}")


def _resolve(*reqs: str, python: str = "3.10", glibc: int = 35) -> dict[str, str]:
    try:
        return board_resolve.resolve(python, glibc, list(reqs))
    except board_resolve.ResolveError as e:
        if "NewConnectionError" in str(e) or "Could not fetch URL" in str(e):
            pytest.skip(f"no package registry: {str(e)[:200]}")
        raise


@pytest.mark.slow
def test_the_export_half_alone_resolves_without_the_runtime_or_onnxruntime(wheels):
    found = _resolve(str(wheels["edgespec-export"]))  # pip install ./export, nothing else named
    assert "edgespec-export" in found and "gguf" in found and "edgespec" not in found, found
    assert not [n for n in found if n.startswith("onnxruntime")], found


@pytest.mark.slow
def test_jetpack_7_2_python_3_12_resolves_the_runtime_and_the_export_half_without_onnxruntime(wheels):
    found = _resolve(f"{wheels['edgespec']}[server]", str(wheels["edgespec-export"]), python="3.12", glibc=39)
    assert "edgespec" in found and "edgespec-export" in found and "starlette" in found
    assert not [n for n in found if n.startswith("onnxruntime")], found


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


def test_the_readmes_board_line_installs_the_right_onnxruntime_on_each_board(tmp_path):
    """README "2. On the board": one line for every board, never PyPI's CPU onnxruntime on a Jetson."""
    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index("**2. On the board**"):].split("```")[1]
    line = next(ln for ln in block.splitlines() if "setup-env.sh" in ln).split("#")[0].split()
    env = dict(kv.split("=", 1) for kv in line if "=" in kv)
    assert line[-1] == "./scripts/setup-env.sh" and "pip install '.[cpu" not in block, block
    (tmp_path / "jetson").mkdir()
    (tmp_path / "pi").mkdir()
    assert _plan(tmp_path / "jetson", JETPACK_6, **env)[1] == f"-e {ROOT}[server]"  # a Jetson: no cpu extra
    assert _plan(tmp_path / "pi", None, **env)[1] == f"-e {ROOT}[cpu,server]"  # a Pi: the CPU wheel
