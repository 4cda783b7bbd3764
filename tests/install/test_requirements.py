"""What the runtime asks of the machine it is installed on (pyproject.toml): no onnxruntime of its own
(the `cpu` extra adds the CPU wheel; a Jetson keeps NVIDIA's onnxruntime-gpu), Python 3.10 or newer,
`import edgespec` and `edgespec doctor` without any onnxruntime, and one line naming both installs where an
engine is opened without one."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _project() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+: the test reads, the runtime never does
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_the_runtime_requires_no_onnxruntime_and_the_cpu_extra_adds_it():
    from edgespec.models.kernels import ORT_FLOORS

    p = _project()
    assert not [d for d in p["dependencies"] if d.startswith("onnxruntime")], p["dependencies"]
    extras = p["optional-dependencies"]
    assert extras["cpu"] == [f"onnxruntime>={ORT_FLOORS['cpu']}"]
    assert "cpu" in extras["all"][0] and p["requires-python"] == ">=3.10"
    assert any(d.startswith("vermin") for d in extras["test"])


def _import_edgespec(*args: str, env_path: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": env_path}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=60)


def _last_line(r: subprocess.CompletedProcess) -> str:
    return r.stderr.strip().splitlines()[-1]


BLOCK = ("import sys\n"
         "class Block:\n"
         "    def find_spec(self, name, path=None, target=None):\n"
         "        if name.split('.')[0] == 'onnxruntime':\n"
         "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
         "sys.meta_path.insert(0, Block())\n")


def test_import_without_any_onnxruntime_works_and_opening_an_engine_is_one_line_naming_both_installs():
    # -S: no site-packages at all, so no onnxruntime anywhere (the repository alone on the path)
    r = _import_edgespec("-S", "-c", "import edgespec, edgespec.errors; print(edgespec.__version__)", env_path=str(ROOT))
    assert r.returncode == 0 and r.stdout.strip() == __import__("edgespec").__version__, r.stderr
    code = BLOCK + ("import edgespec\n"
                    "try:\n"
                    "    edgespec.Engine.open('/nonexistent-bundle')\n"
                    "except ImportError as e:\n"
                    "    print(type(e).__name__, e)\n")
    r = _import_edgespec("-c", code, env_path=str(ROOT))
    assert r.returncode == 0, r.stderr
    line = r.stdout.strip()
    assert line.startswith("OnnxruntimeMissing edgespec needs onnxruntime and none is importable here"), line
    assert "pip install 'edgespec[cpu]'" in line and "onnxruntime-gpu" in line and "Jetson" in line


def _cli_without_onnxruntime(*argv: str, cwd=None) -> subprocess.CompletedProcess:
    code = BLOCK + f"from edgespec.cli.main import main\nsys.exit(main({list(argv)!r}))\n"
    return _import_edgespec("-c", code, env_path=str(ROOT))


def test_doctor_without_onnxruntime_prints_its_report_and_the_install_line_without_a_traceback():
    r = _cli_without_onnxruntime("doctor", "--device", "rpi5-8gb")
    assert r.returncode == 1 and "Traceback" not in r.stderr + r.stdout, r.stderr
    assert "onnxruntime  not importable" in r.stdout and "Raspberry Pi 5" in r.stdout
    assert "missing      onnxruntime: no onnxruntime is importable" in r.stdout
    assert "how: pip install 'edgespec[cpu]'" in r.stdout


@pytest.mark.parametrize("release, want, not_want", [
    ("# R36 (release), REVISION: 4.3, GCID: 1", "--index-url https://pypi.jetson-ai-lab.io/jp6/cu126", "edgespec[cpu]"),
    ("# R36 (release), REVISION: 3.0, GCID: 1", "JetPack 6.0, L4T 36.3.0: no onnxruntime-gpu at edgespec's floor for CUDA 12.2", None),
    ("# R36 (release), REVISION: 5.0, GCID: 1", "--index-url https://pypi.jetson-ai-lab.io/jp6/cu126", "edgespec[cpu]"),
    ("# R39 (release), REVISION: 2, GCID: 1", "JetPack 7.2, L4T 39.2: no onnxruntime-gpu checked for this release", None),
])
def test_doctor_without_onnxruntime_on_a_jetson_names_nvidias_wheel_for_its_jetpack(tmp_path, release, want, not_want):
    root = tmp_path / "jetson"
    shutil.copytree(ROOT / "tests/fakes/jetson-orin-nano", root)
    (root / "etc/nv_tegra_release").write_text(release + "\n")
    r = _cli_without_onnxruntime("doctor", "--root", str(root), "--json")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    import json

    report = json.loads(r.stdout)
    assert [m["what"] for m in report["missing"]] == ["onnxruntime"]
    how = report["missing"][0]["how"]
    assert want in how and (not_want is None or not_want not in how), how


def test_a_command_that_opens_an_engine_without_onnxruntime_is_the_one_line(tiny_bundle, monkeypatch, capsys):
    import edgespec
    from edgespec import errors
    from edgespec.cli import main as cli

    monkeypatch.setattr(errors, "onnxruntime_missing", lambda: True)
    assert cli.main(["generate", str(tiny_bundle), "-p", "hi", "--max-new-tokens", "2"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"edgespec generate: error: {edgespec.MISSING_ONNXRUNTIME}"


def test_a_leftover_onnxruntime_folder_is_not_an_onnxruntime(tmp_path):
    (tmp_path / "onnxruntime").mkdir()  # what `pip uninstall` of one of two onnxruntime wheels leaves
    r = _import_edgespec("-S", "-c", "import edgespec; print(edgespec.onnxruntime_missing())",
                         env_path=f"{tmp_path}{os.pathsep}{ROOT}")
    assert r.returncode == 0 and r.stdout.strip() == "True", r.stderr


def test_import_with_onnxruntime_present_works():
    r = subprocess.run([sys.executable, "-c", "import edgespec; print(edgespec.__version__)"], capture_output=True,
                       text=True, timeout=60, env=os.environ | {"PYTHONPATH": str(ROOT)})
    assert r.returncode == 0 and r.stdout.strip() == __import__("edgespec").__version__, r.stderr


def test_vermin_finds_nothing_newer_than_python_3_10():
    vermin = shutil.which("vermin") or str(Path(sys.executable).parent / "vermin")
    if not Path(vermin).exists():
        pytest.skip("vermin is not installed (pip install 'edgespec[test]')")
    r = subprocess.run([vermin, "-t=3.10-", "--no-tips", "--violations", "--eval-annotations", "edgespec"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Minimum required versions: 3.10" in r.stdout or "Minimum required versions: ~" in r.stdout, r.stdout


def test_vermin_would_say_so_for_a_3_11_module(tmp_path):
    vermin = shutil.which("vermin") or str(Path(sys.executable).parent / "vermin")
    if not Path(vermin).exists():
        pytest.skip("vermin is not installed (pip install 'edgespec[test]')")
    (tmp_path / "new.py").write_text("import tomllib\n")
    r = subprocess.run([vermin, "-t=3.10-", "--no-tips", "--violations", str(tmp_path)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1 and "tomllib" in r.stdout


def test_ci_runs_the_old_onnxruntime_quick_tests_and_each_exists():
    """scripts/test.sh calls scripts/ci-ort.sh; every quick test file it names exists (a rename would
    otherwise only surface in CI), and both flavors' floors are among the versions it installs."""
    import re

    from edgespec.models.kernels import ORT_FLOORS

    assert '"$ROOT/scripts/ci-ort.sh"' in (ROOT / "scripts/test.sh").read_text()
    text = (ROOT / "scripts/ci-ort.sh").read_text()
    quick = re.search(r"^QUICK=\((.*?)\)", text, re.S | re.M).group(1).split()
    assert quick and all((ROOT / q).is_file() for q in quick), quick
    versions = re.search(r'^ORT_VERSIONS=\$\{ORT_VERSIONS:-"([^"]+)"\}', text, re.M).group(1).split()
    assert ORT_FLOORS["cpu"] in versions and "1.24.1" in versions  # 1.24.1: PyPI's build of the 1.24.0 sources
    assert any(v.startswith(ORT_FLOORS["cuda"].rsplit(".", 1)[0]) for v in versions)
    if shutil.which("shellcheck"):
        r = subprocess.run(["shellcheck", "-S", "warning", "scripts/ci-ort.sh", "scripts/test.sh"], cwd=ROOT, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stdout
