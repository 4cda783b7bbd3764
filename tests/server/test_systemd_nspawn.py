"""The unit under a real systemd (PID 1 in systemd-nspawn on a minimal Debian rootfs): installed by
install.sh, active only after READY=1, answers a request, restarted after `kill -9` of its main
process and after the watchdog stops being fed, drained by `systemctl stop`.

Needs root, systemd-nspawn and mmdebstrap (scripts/system-deps.sh); the rootfs and the Python deps
are cached under ~/.cache/edgespec-nspawn (tests/systemd/nspawn.py)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from helpers.wait import wait_for

sys.path.insert(0, str(Path(__file__).parents[1] / "systemd"))
import nspawn  # noqa: E402

pytestmark = pytest.mark.slow

# test-only settings: the hooks (READY held 2 s; SIGUSR2 hangs the loop), a short watchdog and restart
TEST_DROPIN = """[Service]
Environment=EDGESPEC_TEST_HOOKS=1 EDGESPEC_TEST_READY_DELAY=2
WatchdogSec=3
RestartSec=1
"""

HTTP = r"""
import json, sys, urllib.request, urllib.error
method, path, body = sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None
req = urllib.request.Request("http://127.0.0.1:8000" + path, method=method,
                             data=body.encode() if body else None, headers={"Content-Type": "application/json"})
try:
    with urllib.request.urlopen(req, timeout=30) as r:
        print(json.dumps([r.status, r.read().decode()]))
except urllib.error.HTTPError as e:
    print(json.dumps([e.code, e.read().decode()]))
except OSError as e:
    print(json.dumps([0, str(e)]))
"""


@pytest.fixture(scope="module")
def container(tiny_bundle, tmp_path_factory):
    try:
        nspawn.check_host()
    except nspawn.Unavailable as e:
        pytest.skip(str(e))
    rootfs, deps = nspawn.ensure_rootfs(), nspawn.ensure_deps()
    log = tmp_path_factory.mktemp("nspawn") / "console.log"
    c = nspawn.Container(rootfs, deps, tiny_bundle, log_path=log).boot()
    try:
        nspawn.prepare_venv(c)
        yield c
    finally:
        c.shutdown()


def show(c, *props) -> dict[str, str]:
    out = c.run("systemctl", "show", "edgespec.service", *[f"--property={p}" for p in props]).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def http(c, method, path, body=None):
    args = ["/opt/edgespec/venv/bin/python3", "-c", HTTP, method, path]
    if body is not None:
        args.append(json.dumps(body))
    status, text = json.loads(c.run(*args).stdout)
    return status, text


def journal(c) -> str:
    return c.run("journalctl", "-u", "edgespec.service", "--no-pager", "-o", "cat").stdout


def watch_start(c, since_pid=None):
    """Polls a (re)start: records each state seen with /ready's answer, until active with a new PID."""
    seen = []

    def started():
        s = show(c, "ActiveState", "SubState", "MainPID", "NRestarts", "Result")
        ready = http(c, "GET", "/ready")[0] if s["ActiveState"] in ("activating", "active") else None
        seen.append((s["ActiveState"], s["SubState"], s["MainPID"], ready))
        return s if s["ActiveState"] == "active" and s["MainPID"] not in ("0", since_pid) else None

    s = wait_for(f"the unit active with a new main PID (not {since_pid})", started, timeout=60, every=0.1,
                 detail=lambda: f"states seen: {seen[-20:]}\n{journal(c)[-3000:]}")
    return s, seen


def test_service_lifecycle_under_systemd(container, tiny_bundle):
    c = container
    name = tiny_bundle.name
    # install as a user would (no pip: the venv sees the checkout), with the test drop-in in place
    c.run("mkdir", "-p", "/etc/systemd/system/edgespec.service.d")
    c.run("sh", "-c", "cat > /etc/systemd/system/edgespec.service.d/test.conf", input=TEST_DROPIN)
    c.run("mkdir", "-p", f"/srv/{name}")
    c.sh(f"cp -r /srv/bundle-src/. /srv/{name}/")
    r = c.run("/opt/edgespec-src/systemd/install.sh", "--no-pip", "--no-start", f"/srv/{name}")
    assert f"bundle {name}: ok" in r.stderr
    assert c.run("systemctl", "is-enabled", "edgespec.service").stdout.strip() == "enabled"
    env = c.run("cat", "/etc/edgespec/edgespec.env").stdout
    assert f"EDGESPEC_BUNDLE=/opt/edgespec/bundles/{name}" in env

    # 1. active only after READY: while the server already answers /health, the unit is activating
    c.run("systemctl", "start", "--no-block", "edgespec.service")
    s, seen = watch_start(c)
    loading = [x for x in seen if x[0] == "activating" and x[3] == 503]
    assert loading, f"never saw the unit activating while /ready said 503: {seen}"
    assert all(x[3] == 200 for x in seen if x[0] == "active"), seen
    assert http(c, "GET", "/ready")[0] == 200
    status = show(c, "StatusText")["StatusText"]
    assert status.startswith(f"serving {name}")
    log = journal(c)
    assert log.index("ready: serving") < log.rindex("Started edgespec.service")

    # 2. answers a request
    code, text = http(c, "POST", "/v1/chat/completions",
                      {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 5})
    body = json.loads(text)
    assert code == 200 and body["usage"]["completion_tokens"] == 5 and "edgespec" in body
    assert f"endpoint=chat status=200" in journal(c)
    # the hardening is live: a dynamic user, not root, and no capabilities
    pid = s["MainPID"]
    status_file = c.run("cat", f"/proc/{pid}/status").stdout
    uid = [line.split()[1] for line in status_file.splitlines() if line.startswith("Uid:")][0]
    assert uid != "0"
    assert [line.split()[1] for line in status_file.splitlines() if line.startswith("CapEff:")][0] == "0000000000000000"

    # 3. kill -9 of the main process: restarted (on-failure), serving again
    restarts = int(show(c, "NRestarts")["NRestarts"])
    c.sh(f"kill -9 {pid}")  # the shell builtin: minbase has no procps
    s2, seen = watch_start(c, since_pid=pid)
    assert int(s2["NRestarts"]) == restarts + 1
    assert any(x[0] == "activating" and x[3] == 503 for x in seen), seen
    assert http(c, "POST", "/v1/completions", {"prompt": "def f():", "max_tokens": 3})[0] == 200

    # 4. the watchdog: the test hook hangs the serving loop, the pings stop, systemd kills and restarts it
    pid2 = s2["MainPID"]
    c.run("systemctl", "kill", "--kill-whom=main", "--signal=SIGUSR2", "edgespec.service")
    s3, seen = watch_start(c, since_pid=pid2)
    assert int(s3["NRestarts"]) == restarts + 2
    log = journal(c)
    assert "blocking the event loop" in log
    assert "Watchdog timeout" in log, log[-3000:]
    assert http(c, "GET", "/ready")[0] == 200

    # 5. systemctl stop: STOPPING, drain, exit 0 (a clean stop, not a failure)
    c.run("systemctl", "stop", "edgespec.service")
    s4 = show(c, "ActiveState", "Result", "ExecMainStatus", "ExecMainCode")
    assert s4["ActiveState"] == "inactive" and s4["Result"] == "success", s4
    assert s4["ExecMainStatus"] == "0" and s4["ExecMainCode"] == "1", s4  # CLD_EXITED with 0, not killed
    assert "SIGTERM: stopping" in journal(c) or "SIGTERM: draining" in journal(c)


def test_corrupt_bundle_fails_without_a_restart_loop(container, tiny_bundle):
    c = container
    c.run("systemctl", "stop", "edgespec.service", check=False)
    c.run("systemctl", "reset-failed", "edgespec.service", check=False)
    # damage the installed copy behind install.sh's back, then start
    c.sh("f=$(ls /opt/edgespec/bundles/*/target/*.onnx* | head -n 1); "
         "printf 'garbage' | dd of=\"$f\" bs=1 seek=100 conv=notrunc status=none")
    c.run("systemctl", "start", "edgespec.service", check=False)
    wait_for("the unit to fail", lambda: show(c, "ActiveState")["ActiveState"] == "failed", timeout=30)
    # "failed" is terminal: a unit with a restart scheduled sits in activating/auto-restart instead,
    # so reaching it with no restart counted is the proof (RestartPreventExitStatus=78), no waiting
    s = show(c, "ActiveState", "SubState", "ExecMainStatus", "NRestarts")
    assert s["ActiveState"] == "failed" and s["SubState"] == "failed" and s["ExecMainStatus"] == "78"
    assert s["NRestarts"] == "0"
    assert "failed verification" in journal(c)
