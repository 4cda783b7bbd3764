"""The unit file and the installer, checked without a running systemd: `systemd-analyze verify` must
print nothing, `systemd-analyze security --offline=yes` must score <= 2.0, the environment file must
only hold settings `edgespec serve` understands, and install.sh must lay the files out as the unit
expects. (A real systemd runs the unit in test_systemd_nspawn.py.)"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "systemd" / "edgespec.service"
ENVFILE = REPO / "systemd" / "edgespec.env"
INSTALL = REPO / "systemd" / "install.sh"
SYSTEM_UNITS = Path("/usr/lib/systemd/system")

needs_analyze = pytest.mark.skipif(shutil.which("systemd-analyze") is None or not SYSTEM_UNITS.is_dir(),
                                   reason="systemd-analyze is not installed (apt install systemd)")


def unit_settings(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        out.setdefault(key, []).append(value)
    return out


def verify_root(tmp_path: Path, units: dict[str, str], exec_paths=("/opt/edgespec/venv/bin/python3",)) -> Path:
    """A file tree for `systemd-analyze verify --root`: the system's stock units (targets the unit
    refers to), the ExecStart binaries (verify checks they exist) and our units."""
    root = tmp_path / "root"
    shutil.copytree(SYSTEM_UNITS, root / "usr/lib/systemd/system", symlinks=True)
    for p in exec_paths:
        exe = root / p.lstrip("/")
        exe.parent.mkdir(parents=True, exist_ok=True)
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
    for rel, text in units.items():
        f = root / "etc/systemd/system" / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    return root


def verify(root: Path, unit: str = "edgespec.service") -> str:
    r = subprocess.run(["systemd-analyze", "verify", f"--root={root}", unit], capture_output=True, text=True, timeout=60)
    return (r.stdout + r.stderr).strip()


@needs_analyze
def test_systemd_analyze_verify_prints_nothing(tmp_path):
    root = verify_root(tmp_path, {"edgespec.service": UNIT.read_text()})
    assert verify(root) == ""


@needs_analyze
def test_verify_would_catch_a_mistake(tmp_path):
    """The check above can fail: a misspelt key or a missing binary is reported."""
    bad = UNIT.read_text().replace("Restart=on-failure", "Restat=on-failure")
    root = verify_root(tmp_path, {"edgespec.service": bad})
    assert "Unknown key 'Restat'" in verify(root)
    root2 = verify_root(tmp_path / "b", {"edgespec.service": UNIT.read_text()}, exec_paths=())
    assert verify(root2) != ""


@needs_analyze
def test_security_exposure_at_most_2(tmp_path):
    r = subprocess.run(["systemd-analyze", "security", "--offline=yes", "--no-pager", str(UNIT)],
                       capture_output=True, text=True, timeout=60)
    m = re.search(r"Overall exposure level for edgespec\.service: (\d+\.\d+)", r.stdout)
    assert m, r.stdout + r.stderr
    assert float(m.group(1)) <= 2.0, r.stdout


def test_unit_is_notify_with_watchdog_restart_and_hardening():
    s = unit_settings(UNIT.read_text())
    one = {k: v[-1] for k, v in s.items()}
    assert one["Type"] == "notify" and one["NotifyAccess"] == "main"
    assert int(one["WatchdogSec"]) > 0 and one["Restart"] == "on-failure"
    assert one["RestartPreventExitStatus"] == "78"  # a config error is not retried
    assert one["DynamicUser"] == "yes" and one["StateDirectory"] == "edgespec" and one["CacheDirectory"] == "edgespec"
    assert one["MemoryMax"] and one["SupplementaryGroups"].split() == ["video", "render"]
    for key, value in {"ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes",
                       "NoNewPrivileges": "yes"}.items():
        assert one[key] == value, key
    assert set(one["RestrictAddressFamilies"].split()) == {"AF_UNIX", "AF_INET", "AF_INET6"}
    assert one["EnvironmentFile"] == "/etc/edgespec/edgespec.env"
    assert one["ExecStart"] == "/opt/edgespec/venv/bin/python3 -m edgespec serve"
    # TimeoutStopSec leaves room for the drain (EDGESPEC_DRAIN_TIMEOUT, 10 s by default)
    assert int(one["TimeoutStopSec"]) > 10


def test_no_secret_in_the_unit_or_on_the_command_line():
    text = UNIT.read_text() + ENVFILE.read_text()
    assert not re.search(r"^\s*[A-Z_]*(API_KEY|TOKEN|PASSWORD)\s*=", text, re.M | re.I), "a secret-looking setting"
    assert "--api-key" not in unit_settings(UNIT.read_text())["ExecStart"][0]


def test_env_file_holds_only_settings_serve_reads(monkeypatch):
    from edgespec.cli.commands import serve

    src = Path(serve.__file__).read_text()
    names = re.findall(r"^(EDGESPEC_[A-Z_]+)=", ENVFILE.read_text(), re.M)
    assert "EDGESPEC_BUNDLE" in names and "EDGESPEC_HOST" in names
    for name in names:
        assert f'"{name}"' in src, f"{name} in edgespec.env is not read by edgespec serve"
    # the shipped values parse into a valid configuration
    for line in ENVFILE.read_text().splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.partition("=")
            monkeypatch.setenv(k, v)
    import argparse

    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers()
    serve.register(sub)
    args = ap.parse_args(["serve"])
    cfg = serve.server_config(args)
    cfg.check()
    assert cfg.host == "127.0.0.1" and cfg.port == 8000 and cfg.ui is False and cfg.api_key_file is None
    assert serve.engine_options(args) == {"draft": "auto", "verify": True}


# --- install.sh into a file tree (--root): no systemctl, no pip ------------------------------------------
def run_install(*args, check=True):
    r = subprocess.run(["bash", str(INSTALL), *map(str, args)], capture_output=True, text=True, timeout=120)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def test_install_into_a_root(tmp_path, tiny_bundle):
    root = tmp_path / "img"
    key = root / "etc/edgespec/api-key"
    key.parent.mkdir(parents=True)
    key.write_text("install-0123456789abcdef")
    key.chmod(0o600)
    run_install("--root", root, "--api-key-file", "/etc/edgespec/api-key", "--port", "8080", "--host", "0.0.0.0",
                tiny_bundle)
    name = tiny_bundle.name
    dest = root / "opt/edgespec/bundles" / name
    assert (dest / "manifest.json").read_bytes() == (tiny_bundle / "manifest.json").read_bytes()
    assert sorted(p.relative_to(dest) for p in dest.rglob("*")) == sorted(p.relative_to(tiny_bundle) for p in tiny_bundle.rglob("*"))
    assert not list((root / "opt/edgespec/bundles").glob("*.partial"))
    env = (root / "etc/edgespec/edgespec.env").read_text()
    assert f"\nEDGESPEC_BUNDLE=/opt/edgespec/bundles/{name}\n" in env
    assert "\nEDGESPEC_PORT=8080\n" in env and "\nEDGESPEC_HOST=0.0.0.0\n" in env
    unit = root / "etc/systemd/system/edgespec.service"
    assert unit.read_text() == UNIT.read_text()
    dropins = root / "etc/systemd/system/edgespec.service.d"
    assert "LoadCredential=api-key:/etc/edgespec/api-key" in (dropins / "api-key.conf").read_text()
    assert "IPAddressAllow=any" in (dropins / "network.conf").read_text()
    if shutil.which("systemd-analyze") and SYSTEM_UNITS.is_dir():  # the unit with its drop-ins still verifies
        vroot = verify_root(tmp_path, {"edgespec.service": unit.read_text(),
                                       "edgespec.service.d/api-key.conf": (dropins / "api-key.conf").read_text(),
                                       "edgespec.service.d/network.conf": (dropins / "network.conf").read_text()})
        assert verify(vroot) == ""

    # a second run keeps the user's edits and changes only what it is told
    envfile = root / "etc/edgespec/edgespec.env"
    envfile.write_text(envfile.read_text().replace("EDGESPEC_QUEUE_SIZE=8", "EDGESPEC_QUEUE_SIZE=3"))
    run_install("--root", root, "--host", "127.0.0.1", tiny_bundle)
    env = envfile.read_text()
    assert "\nEDGESPEC_QUEUE_SIZE=3\n" in env and "\nEDGESPEC_PORT=8080\n" in env and "\nEDGESPEC_HOST=127.0.0.1\n" in env
    assert not (dropins / "network.conf").exists()  # back to localhost only
    assert (dropins / "api-key.conf").exists()  # never dropped silently


def test_install_with_a_venv_elsewhere_rewrites_exec_start(tmp_path, tiny_bundle):
    root = tmp_path / "img"
    run_install("--root", root, "--venv", "/srv/py", "--prefix", "/srv/edgespec", tiny_bundle)
    unit = (root / "etc/systemd/system/edgespec.service").read_text()
    assert "ExecStart=/srv/py/bin/python3 -m edgespec serve" in unit
    assert (root / "srv/edgespec/bundles" / tiny_bundle.name / "manifest.json").exists()


def test_install_kiosk(tmp_path, tiny_bundle):
    if not (REPO / "systemd/edgespec-kiosk.service").exists():
        pytest.skip("systemd/edgespec-kiosk.service is not in this checkout")
    root = tmp_path / "img"
    run_install("--root", root, "--kiosk", "--port", "8123", tiny_bundle)
    assert (root / "etc/systemd/system/edgespec-kiosk.service").exists()
    script = root / "opt/edgespec/kiosk-browser.sh"
    assert script.exists() and os.access(script, os.X_OK)
    assert "\nEDGESPEC_UI=1\n" in (root / "etc/edgespec/edgespec.env").read_text()
    assert "EDGESPEC_KIOSK_URL=http://127.0.0.1:8123/" in (root / "etc/edgespec/kiosk.env").read_text()


@pytest.mark.parametrize("args, message", [
    (["{nope}"], "not a bundle"),
    (["--port", "http", "{bundle}"], "--port must be a number"),
    (["--port", "70000", "{bundle}"], "1..65535"),
    (["--api-key-file", "/nonexistent/key", "{bundle}"], "does not exist"),
    (["--frobnicate", "{bundle}"], "unknown option"),
    ([], "no bundle given"),
    (["{bundle}", "{bundle}"], "one bundle only"),
])
def test_install_refuses_bad_input(tmp_path, tiny_bundle, args, message):
    args = [a.format(nope=tmp_path / "nope", bundle=tiny_bundle) for a in args]
    r = run_install("--root", tmp_path / "img", *args, check=False)
    assert r.returncode != 0 and message in r.stderr, r.stderr
    assert not (tmp_path / "img/etc/systemd/system/edgespec.service").exists()


# --- which onnxruntime the installer's venv gets (--print-pip: the pip line, nothing installed) ------------
def _fake_venv(tmp_path: Path, name: str, site: Path | None) -> Path:
    """PREFIX/venv/bin/python3: this python without site-packages, seeing only `site` (a stand-in for
    JetPack's system packages holding onnxruntime-gpu)."""
    import sys

    prefix = tmp_path / name
    py = prefix / "venv/bin/python3"
    py.parent.mkdir(parents=True)
    path = f"PYTHONPATH={site} " if site else "PYTHONPATH= "
    py.write_text(f"#!/bin/sh\n{path}exec {sys.executable} -S \"$@\"\n")
    py.chmod(0o755)
    return prefix


def test_installer_never_adds_the_cpu_onnxruntime_beside_a_gpu_one(tmp_path):
    gpu = tmp_path / "jetpack-site"
    (gpu / "onnxruntime").mkdir(parents=True)
    (gpu / "onnxruntime/__init__.py").write_text("__version__ = '1.24.0'  # NVIDIA's onnxruntime-gpu\n")
    leftover = tmp_path / "leftover-site"
    (leftover / "onnxruntime").mkdir(parents=True)  # a folder without its module: no onnxruntime
    for name, site, extras in (("jetson", gpu, "server"), ("pi", None, "server,cpu"), ("broken", leftover, "server,cpu")):
        out = run_install("--prefix", _fake_venv(tmp_path, name, site), "--print-pip").stdout.strip()
        assert out.endswith(f"-m pip install '{REPO}[{extras}]'"), (name, out)
        assert f"{tmp_path}/{name}/venv/bin/python3" in out


def test_installer_on_a_jetson_without_onnxruntime_adds_no_cpu_one_and_names_nvidias_wheel(tmp_path, tiny_bundle):
    release = tmp_path / "nv_tegra_release"
    release.write_text("# R36 (release), REVISION: 4.3, GCID: 1\n")
    prefix = _fake_venv(tmp_path, "jetson-bare", None)
    env = os.environ | {"EDGESPEC_TEGRA_RELEASE": str(release)}
    r = subprocess.run(["bash", str(INSTALL), "--prefix", str(prefix), "--print-pip"], capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode == 0 and r.stdout.strip().endswith(f"-m pip install '{REPO}[server]'"), r.stdout + r.stderr
    r = subprocess.run(["bash", str(INSTALL), "--prefix", str(prefix), str(tiny_bundle)], capture_output=True,
                       text=True, timeout=120, env=env)
    if os.geteuid() != 0 or shutil.which("systemctl") is None:
        pytest.skip("the refusal comes after the root and systemd checks")
    assert r.returncode == 1 and "sees no onnxruntime: install NVIDIA's onnxruntime-gpu" in r.stderr, r.stderr
    assert "--index-url https://pypi.jetson-ai-lab.io/jp6/cu126" in r.stderr and "edgespec[" not in r.stderr
