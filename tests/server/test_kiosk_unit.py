"""The kiosk's boot pieces: edgespec-kiosk.service (systemd-analyze verify, its contract with
edgespec.service) and kiosk-browser.sh (waits for the page, fresh profile, clear errors), the latter
also for real: Chromium inside cage, headless. `install.sh --kiosk` is tested with the server's
install tests (tests/server/test_systemd_unit.py).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from kiosk.browser import IN_CI, chromium_path
from kiosk.fake_server import FakeServer

REPO = Path(__file__).resolve().parents[2]
SYSTEMD = REPO / "systemd"
UNIT = SYSTEMD / "edgespec-kiosk.service"
LAUNCHER = SYSTEMD / "kiosk-browser.sh"
NOBODY = 65534


def read_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """Unit file -> {section: {key: [values in order]}} (keys may repeat, unlike an ini file)."""
    out: dict[str, dict[str, list[str]]] = {}
    section = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = out.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        section.setdefault(key.strip(), []).append(value.strip())
    return out


def words(unit: dict, section: str, key: str) -> list[str]:
    return [w for v in unit[section].get(key, []) for w in v.split()]


# ------------------------------------------------------------------------------ the unit
def test_unit_contract_with_the_server_unit():
    u = read_unit(UNIT)
    # after the server is READY, but not torn down with it: the page shows "reconnecting" instead
    assert "edgespec.service" in words(u, "Unit", "After")
    assert "edgespec.service" in words(u, "Unit", "Wants")
    for key in ("Requires", "BindsTo", "PartOf", "Requisite"):
        assert "edgespec.service" not in words(u, "Unit", key), key
    s = u["Service"]
    assert s["Restart"] == ["always"], "a browser that dies must come back"
    assert s["RestartPreventExitStatus"] == ["78"]
    assert u["Unit"]["StartLimitIntervalSec"] == ["0"], "an unattended kiosk never gives up"
    assert s["User"][0] not in ("root", "0")
    assert s["ExecStart"] == ["/opt/edgespec/kiosk-browser.sh"]
    assert s["PAMName"] and s["TTYPath"], "a logind session on a VT gives the user the screen"
    assert s["RuntimeDirectory"] == ["edgespec-kiosk"] and s["Environment"] == ["HOME=/run/edgespec-kiosk"]
    assert u["Install"]["WantedBy"] == ["multi-user.target"]
    # the server unit really is Type=notify, so After= waits for its READY=1
    server = read_unit(SYSTEMD / "edgespec.service")
    assert server["Service"]["Type"] == ["notify"]


def _systemd_root(tmp_path: Path) -> Path:
    """A file tree as install.sh leaves it: the units in /etc, the launcher where ExecStart= says."""
    root = tmp_path / "root"
    (root / "etc/systemd/system").mkdir(parents=True)
    (root / "opt/edgespec").mkdir(parents=True)
    shutil.copy(LAUNCHER, root / "opt/edgespec/kiosk-browser.sh")
    for unit in ("edgespec.service", "edgespec-kiosk.service"):
        shutil.copy(SYSTEMD / unit, root / "etc/systemd/system" / unit)
    (root / "usr/lib/systemd").mkdir(parents=True)
    shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    return root


def test_systemd_analyze_verify_prints_nothing(tmp_path):
    if not shutil.which("systemd-analyze") or not Path("/usr/lib/systemd/system").is_dir():
        pytest.skip("systemd-analyze not installed")
    root = _systemd_root(tmp_path)
    r = subprocess.run(["systemd-analyze", "verify", f"--root={root}",
                        str(root / "etc/systemd/system/edgespec-kiosk.service")],
                       capture_output=True, text=True)
    assert (r.stdout + r.stderr).strip() == "", r.stdout + r.stderr
    assert r.returncode == 0


def test_verify_would_catch_a_broken_unit(tmp_path):
    """The check above can fail: the same run on a unit with a typo prints the problem."""
    if not shutil.which("systemd-analyze") or not Path("/usr/lib/systemd/system").is_dir():
        pytest.skip("systemd-analyze not installed")
    root = _systemd_root(tmp_path)
    unit = root / "etc/systemd/system/edgespec-kiosk.service"
    unit.write_text(unit.read_text().replace("Restart=always", "Restart=allways"))
    r = subprocess.run(["systemd-analyze", "verify", f"--root={root}", str(unit)], capture_output=True, text=True)
    assert "allways" in r.stdout + r.stderr


# ------------------------------------------------------------------------------ kiosk-browser.sh
def as_nobody(cmd: list[str]) -> list[str]:
    """Chromium and cage refuse root; the tests run them as nobody when they run as root."""
    if os.geteuid() != 0:
        return cmd
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *cmd]


@pytest.fixture
def user_dir():
    """A folder the launcher's user (nobody, when the tests run as root) owns and can reach: pytest's
    own tmp folders sit under a root-only parent."""
    made = []

    def make(_unused=None, name: str = "home") -> Path:
        d = Path(tempfile.mkdtemp(prefix=f"edgespec-kiosk-{name}-"))
        if os.geteuid() == 0:
            os.chown(d, NOBODY, NOBODY)
        made.append(d)
        return d

    yield make
    for d in made:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def launcher(user_dir) -> Path:
    """kiosk-browser.sh copied where its user can read it: a clone inside a folder only its owner can
    enter (as /root is, and as `mktemp -d` makes) keeps nobody from opening the one in systemd/."""
    copy = user_dir(name="launcher") / LAUNCHER.name
    shutil.copy(LAUNCHER, copy)
    copy.chmod(0o755)
    return copy


def launcher_env(home: Path, **extra: str) -> dict[str, str]:
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "XDG_RUNTIME_DIR": str(home),
           "EDGESPEC_PYTHON": sys.executable}
    env.update(extra)
    return env


@pytest.mark.parametrize("env,message", [
    ({"EDGESPEC_KIOSK_URL": "file:///etc/passwd"}, "must be an http(s) URL"),
    ({"EDGESPEC_KIOSK_WAIT": "soon"}, "EDGESPEC_KIOSK_WAIT must be a whole number"),
    ({"EDGESPEC_KIOSK_BROWSER": "/nonexistent/chromium"}, "Chromium not found"),
    ({"EDGESPEC_KIOSK_BROWSER": "true", "EDGESPEC_KIOSK_COMPOSITOR": "no-such-compositor --"},
     "no graphical session and no 'no-such-compositor'"),
])
def test_launcher_setup_errors_exit_78_with_the_reason(user_dir, launcher, env, message):
    home = user_dir()
    r = subprocess.run(as_nobody(["sh", str(launcher)]), env=launcher_env(home, **env),
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 78, (r.returncode, r.stderr)
    assert message in r.stderr


def test_launcher_refuses_root(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to show the refusal")
    r = subprocess.run(["sh", str(LAUNCHER)], env=launcher_env(tmp_path, DISPLAY=":0"),
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 78 and "refusing to run the browser as root" in r.stderr


FAKE_BROWSER = """#!/bin/sh
# records how the launcher started it, then stays up like a browser
printf '%s\\n' "$@" > "{record}"
ls -A "$(printf '%s\\n' "$@" | sed -n 's/^--user-data-dir=//p')" > "{record}.profile"
: > "{record}.done"
exec sleep 30
"""


def test_launcher_waits_for_the_page_then_starts_the_browser_with_a_fresh_profile(user_dir, launcher):
    home = user_dir()
    record = home / "args"
    fake = home / "fake-chromium"
    fake.write_text(FAKE_BROWSER.format(record=record))
    fake.chmod(0o755)
    profile = home / "profile"
    profile.mkdir()
    (profile / "left-over-from-last-run").write_text("x")
    if os.geteuid() == 0:
        for p in (fake, profile, profile / "left-over-from-last-run"):
            os.chown(p, NOBODY, NOBODY)
    server = FakeServer()
    server.behaviour.page_status = 503  # up, but the page is not ready yet: the launcher must wait
    server.start()
    port = server.port
    url = f"http://127.0.0.1:{port}/?max_turns=3"
    env = launcher_env(home, DISPLAY=":99", EDGESPEC_KIOSK_URL=url, EDGESPEC_KIOSK_BROWSER=str(fake),
                       EDGESPEC_KIOSK_PROFILE=str(profile), EDGESPEC_KIOSK_FLAGS="--force-device-scale-factor=1.5")
    proc = subprocess.Popen(as_nobody(["sh", str(launcher)]), env=env, stderr=subprocess.PIPE, text=True)
    try:
        # two refused probes seen by the server: the launcher is waiting, and it starts the browser only
        # after a probe succeeds, so the browser cannot have started yet
        server.wait_for(lambda: server.paths.count("/") >= 2, timeout=20, what="the launcher to probe twice")
        assert not record.exists(), "the browser started before the page answered"
        assert proc.poll() is None
        server.behaviour.page_status = 200
        server.wait_for(Path(f"{record}.done").exists, timeout=20, what="the launcher to start the browser")
        args = record.read_text().split("\n")
        assert args[:2] == ["--kiosk", url]
        assert f"--user-data-dir={profile}" in args
        assert "--force-device-scale-factor=1.5" in args
        assert "--disable-background-networking" in args and "--no-first-run" in args
        assert Path(f"{record}.profile").read_text() == "", "the profile was not emptied"
        assert "/" in server.paths, "the launcher checked the page itself"
        server.stop()
    finally:
        proc.kill()
        _, err = proc.communicate(timeout=10)
    assert f"waiting for {url}" in err


def test_launcher_gives_up_after_the_configured_wait(user_dir, launcher):
    home = user_dir()
    server = FakeServer().start()
    port = server.port
    server.stop()
    env = launcher_env(home, DISPLAY=":99", EDGESPEC_KIOSK_URL=f"http://127.0.0.1:{port}/",
                       EDGESPEC_KIOSK_BROWSER="true", EDGESPEC_KIOSK_WAIT="2")
    r = subprocess.run(as_nobody(["sh", str(launcher)]), env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "did not answer within 2 s" in r.stderr


# ------------------------------------------------------------------------------ for real: cage + Chromium
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_kiosk_in_cage_shows_the_page_and_exits_when_the_browser_dies(user_dir, launcher):
    """What the unit runs on a board, with cage's headless backend instead of a screen. (No screenshot:
    wlroots' headless output with software rendering captures only part of the window; the proof that
    the page runs is that its script polls the server.)"""
    missing = [t for t in ("cage", "setpriv") if not shutil.which(t)]
    if not chromium_path():
        missing.append("chromium")
    if missing or os.geteuid() != 0:
        reason = f"needs root and {', '.join(missing) or 'nothing else'} (apt install cage xwayland chromium)"
        if IN_CI:
            pytest.fail(reason)
        pytest.skip(reason)
    home = user_dir(name="run")
    server = FakeServer().start()
    env = launcher_env(home, EDGESPEC_KIOSK_URL=server.url, EDGESPEC_KIOSK_PROFILE=str(home / "profile"),
                       EDGESPEC_KIOSK_BROWSER=chromium_path(), EDGESPEC_KIOSK_FLAGS="--disable-gpu",
                       # no screen here: wlroots' headless backend and software rendering
                       WLR_BACKENDS="headless", WLR_LIBINPUT_NO_DEVICES="1", WLR_RENDERER="pixman")
    proc = subprocess.Popen(as_nobody(["sh", str(launcher)]), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        # the page ran in the kiosk browser: its script asked for /ready and the model
        server.wait_for(lambda: {"/", "/app.js", "/style.css", "/ready", "/v1/models"} <= set(server.paths),
                        timeout=60, what=f"the kiosk browser to load the page (saw {server.paths})")
        assert proc.poll() is None
        # the browser dies -> the launcher (cage) exits, so systemd's Restart=always brings it back
        children = _children(proc.pid)  # the launcher exec'd cage; cage's child is the browser
        assert children, "cage has no browser child"
        for pid in children:
            os.kill(pid, 9)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
        server.stop()
    assert "showing " + server.url in proc.stderr.read()


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out
