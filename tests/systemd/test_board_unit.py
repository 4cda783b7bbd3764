"""The service and the board it runs on: the unit starts after nvpmodel (the power mode set first), install.sh caps
memory at the board's budget where the GPU shares the RAM (a Jetson: CUDA's allocations are not what a share of RAM
was sized for), and --jetson-clocks is an opt-in drop-in, refused in one line off a Jetson. Checked in a file tree
(install.sh --root) on fake boards; `systemd-analyze verify` passes the unit with the drop-ins where it is installed."""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edgespec.edge import devices

REPO = Path(__file__).resolve().parents[2]
FAKES = REPO / "tests/fakes"
UNIT = REPO / "systemd/edgespec.service"
_spec = importlib.util.spec_from_file_location("unit_checks", REPO / "tests/server/test_systemd_unit.py")
unit_checks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(unit_checks)


def test_the_unit_starts_after_nvpmodel_and_the_network():
    after = unit_checks.unit_settings(UNIT.read_text())["After"]
    assert after == ["network.target nvpmodel.service"]


def _install(tmp_path: Path, board: str, bundle: Path, *args: str, tegra: bool) -> subprocess.CompletedProcess:
    release = tmp_path / "nv_tegra_release"
    if tegra:
        shutil.copy(FAKES / board / "etc/nv_tegra_release", release)
    env = os.environ | {"EDGESPEC_BOARD_ROOT": str(FAKES / board), "EDGESPEC_TEGRA_RELEASE": str(release)}
    return subprocess.run(["bash", str(REPO / "systemd/install.sh"), "--root", str(tmp_path / "img"),
                           "--python", sys.executable, *args, str(bundle)], capture_output=True, text=True,
                          timeout=120, env=env)


def test_a_jetson_gets_its_memory_budget_as_the_cap_and_jetson_clocks_only_when_asked(tmp_path, tiny_bundle):
    r = _install(tmp_path, "jetson-orin-nano", tiny_bundle, tegra=True)
    assert r.returncode == 0, r.stderr
    dropins = tmp_path / "img/etc/systemd/system/edgespec.service.d"
    budget = devices.detect(FAKES / "jetson-orin-nano").memory_budget_bytes
    assert budget == 7620468 * 1024 - int(2.5 * (1 << 30))  # MemTotal less the Orin Nano's 2.5 GiB reserve
    memory = unit_checks.unit_settings((dropins / "memory.conf").read_text())
    assert memory == {"MemoryHigh": [str(budget // 10 * 9)], "MemoryMax": [str(budget)]}
    assert not (dropins / "jetson-clocks.conf").exists()

    r = _install(tmp_path, "jetson-orin-nano", tiny_bundle, "--jetson-clocks", tegra=True)
    assert r.returncode == 0 and "jetson_clocks runs before each start" in r.stderr, r.stderr
    clocks = unit_checks.unit_settings((dropins / "jetson-clocks.conf").read_text())
    assert clocks == {"ExecStartPre": ["-+/usr/bin/jetson_clocks"]}
    if shutil.which("systemd-analyze") and unit_checks.SYSTEM_UNITS.is_dir():
        root = unit_checks.verify_root(tmp_path / "verify", {
            "edgespec.service": UNIT.read_text(),
            "edgespec.service.d/memory.conf": (dropins / "memory.conf").read_text(),
            "edgespec.service.d/jetson-clocks.conf": (dropins / "jetson-clocks.conf").read_text()},
            exec_paths=("/opt/edgespec/venv/bin/python3", "/usr/bin/jetson_clocks"))
        assert unit_checks.verify(root) == ""

    r = _install(tmp_path, "jetson-orin-nano", tiny_bundle, "--no-jetson-clocks", tegra=True)
    assert r.returncode == 0 and not (dropins / "jetson-clocks.conf").exists(), r.stderr


def test_a_pi_keeps_the_units_shares_and_refuses_jetson_clocks_in_one_line(tmp_path, tiny_bundle):
    r = _install(tmp_path, "rpi5", tiny_bundle, tegra=False)
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "img/etc/systemd/system/edgespec.service.d/memory.conf").exists()
    r = _install(tmp_path, "rpi5", tiny_bundle, "--jetson-clocks", tegra=False)
    assert r.returncode == 1
    assert r.stderr == f"install.sh: error: --jetson-clocks: this is not a Jetson (no {tmp_path}/nv_tegra_release)\n"
