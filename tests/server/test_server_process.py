"""`edgespec serve` as a real process with a fake NOTIFY_SOCKET: READY only after load and warm-up,
WATCHDOG pings from the serving loop, STOPPING and a graceful drain on SIGTERM mid-request, exit
codes, journald-friendly logs. (The same under a real systemd: test_systemd_nspawn.py.)"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from helpers.wait import wait_for

pytest.importorskip("uvicorn", reason="the server extra is not installed (pip install .[server])")


class Notify:
    """A fake systemd: a datagram socket that records every message with its arrival time."""

    def __init__(self, path):
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.1)
        self.messages: list[tuple[float, str]] = []
        self._stop = False
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()

    def _read(self):
        while not self._stop:
            try:
                data = self.sock.recv(4096).decode()
                self.messages.append((time.monotonic(), data))
            except socket.timeout:
                continue
            except OSError:
                return

    def wait_for(self, text, timeout=30):
        """The arrival time of the first message that holds the line `text`."""
        def arrived():
            return next((t for t, m in list(self.messages) if text in m.split("\n")), None)

        return wait_for(f"{text} on the notify socket", arrived, timeout=timeout, every=0.01,
                        detail=lambda: f"got {[m for _, m in self.messages]}")

    def count(self, text):
        return sum(text in m.split("\n") for _, m in list(self.messages))

    def drain(self):
        """Returns once every datagram sent before this call has been read: a marker sent now is
        queued behind them (a datagram socket keeps its order), so seeing it means the rest is in."""
        marker = f"TEST_MARKER={time.monotonic_ns()}"
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto(marker.encode(), self.path)
        self.wait_for(marker, timeout=10)

    def wait_count(self, text, n, timeout=30):
        wait_for(f"{n} x {text} on the notify socket", lambda: self.count(text) >= n, timeout=timeout, every=0.01,
                 detail=lambda: f"only {self.count(text)}")

    def close(self):
        self._stop = True
        self._t.join(1)
        self.sock.close()


class Proc:
    def __init__(self, bundle, tmp_path, *args, env=None, notify=True):
        self.notify = Notify(tmp_path / "notify.sock") if notify else None
        e = dict(os.environ)
        for k in list(e):
            if k.startswith("EDGESPEC_") or k in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "JOURNAL_STREAM"):
                del e[k]
        e.update({"PYTHONUNBUFFERED": "1"})
        if self.notify:
            e["NOTIFY_SOCKET"] = self.notify.path
        e.update(env or {})
        self.p = subprocess.Popen([sys.executable, "-m", "edgespec", "serve", str(bundle), "--port", "0", *args],
                                  env=e, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.port = None
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()

    def _read(self):
        for line in self.p.stderr:
            self.lines.append(line.rstrip("\n"))

    def wait_port(self, timeout=30):
        def port():
            found = [re.search(r"listening on http://127\.0\.0\.1:(\d+)", line) for line in list(self.lines)]
            m = next((m for m in found if m), None)
            assert m is not None or self.p.poll() is None, "the server exited:\n" + "\n".join(self.lines)
            return int(m.group(1)) if m else None

        self.port = wait_for("the server's 'listening on' line", port, timeout=timeout, every=0.02,
                             detail=lambda: "\n".join(self.lines))
        return self.port

    def url(self, path):
        return f"http://127.0.0.1:{self.port}{path}"

    def get(self, path):
        try:
            with urllib.request.urlopen(self.url(path), timeout=10) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def post(self, path, body, timeout=30):
        req = urllib.request.Request(self.url(path), data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def metric(self, name: str) -> float:
        status, body = self.get("/metrics")
        assert status == 200, body
        for line in body.decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
        raise AssertionError(f"no metric {name}")

    def wait_metric(self, name: str, value: float, timeout=30):
        """Waits until /metrics shows `name` at `value` (the server's own account of its state)."""
        wait_for(f"{name} {value} in /metrics", lambda: self.metric(name) == value, timeout=timeout, every=0.02,
                 detail=lambda: f"it is {self.metric(name)}")

    def wait(self, timeout=30):
        try:
            return self.p.wait(timeout)
        finally:
            self._t.join(2)

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait(5)
        if self.notify:
            self.notify.close()


@pytest.fixture
def proc(tmp_path):
    made = []

    def start(bundle, *args, **kw):
        p = Proc(bundle, tmp_path, *args, **kw)
        made.append(p)
        return p

    yield start
    for p in made:
        p.kill()


HOOKS = {"EDGESPEC_TEST_HOOKS": "1"}
MSG = [{"role": "user", "content": "write a function"}]


def test_ready_only_after_load_and_warmup_then_watchdog_pings(proc, tiny_bundle):
    p = proc(tiny_bundle, env={**HOOKS, "EDGESPEC_TEST_READY_DELAY": "1.5", "WATCHDOG_USEC": "300000"})
    p.wait_port()
    # loading (held 1.5 s by the test hook): alive but not ready, and no READY=1 yet
    assert p.get("/health")[0] == 200
    status, body = p.get("/ready")
    assert status == 503 and json.loads(body)["status"] == "loading"
    assert p.notify.count("READY=1") == 0
    t_ready = p.notify.wait_for("READY=1")
    assert p.get("/ready")[0] == 200
    statuses = [m for _, m in p.notify.messages if m.startswith("STATUS=")]
    assert statuses[0] == "STATUS=loading the model" and "STATUS=warming up" in statuses
    assert "serving" in [m for t, m in p.notify.messages if "READY=1" in m][0]
    # the serving loop keeps pinging after READY (the interval itself, a third of WATCHDOG_USEC, is
    # ping_interval's, tested in test_sdnotify.py; here: they keep coming, from this process)
    before = p.notify.count("WATCHDOG=1")
    p.notify.wait_count("WATCHDOG=1", before + 5)
    status, body = p.post("/v1/chat/completions", {"messages": MSG, "max_tokens": 4})
    assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 4
    p.p.send_signal(signal.SIGTERM)
    assert p.wait() == 0
    p.notify.wait_for("STOPPING=1", timeout=1)


def test_hung_serving_loop_stops_the_watchdog_pings(proc, tiny_bundle):
    """The SIGUSR2 test hook blocks the event loop, as a real hang would: the pings must stop."""
    p = proc(tiny_bundle, env={**HOOKS, "WATCHDOG_USEC": "300000"})
    p.wait_port()
    p.notify.wait_for("READY=1")
    p.notify.wait_count("WATCHDOG=1", 2)
    p.p.send_signal(signal.SIGUSR2)
    # the hook says how many pings the loop had sent when it blocked; a blocked loop sends no more
    def blocked():
        assert p.p.poll() is None, "the server exited:\n" + "\n".join(p.lines)
        return next((re.search(r"blocking the event loop for good after (\d+) watchdog pings", x)
                     for x in list(p.lines) if "blocking the event loop" in x), None)

    m = wait_for("the hook's 'blocking the event loop' line", blocked, timeout=30, every=0.01,
                 detail=lambda: "\n".join(p.lines))
    sent = int(m.group(1))
    p.notify.wait_count("WATCHDOG=1", sent)
    p.p.kill()
    p.p.wait(10)
    p.notify.drain()  # everything the process ever sent has been read
    assert p.notify.count("WATCHDOG=1") == sent  # not one ping after the hang: systemd would kill it
    assert p.notify.count("STOPPING=1") == 0


def _stream_in_background(p, body, out, headers=None):
    def go():
        req = urllib.request.Request(p.url("/v1/chat/completions"), data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                out["status"] = r.status
                out["raw"] = r.read().decode()
        except urllib.error.HTTPError as e:
            out["status"] = e.code
            out["raw"] = e.read().decode()

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def test_sigterm_mid_request_drains_and_exits_0(proc, tiny_bundle):
    p = proc(tiny_bundle, env={**HOOKS, "EDGESPEC_TEST_TOKEN_DELAY": "0.03"})
    p.wait_port()
    p.notify.wait_for("READY=1")
    running, queued = {}, {}
    t1 = _stream_in_background(p, {"messages": MSG, "max_tokens": 60, "stream": True}, running)
    p.wait_metric("edgespec_busy", 1)  # it is generating now
    t2 = _stream_in_background(p, {"messages": MSG, "max_tokens": 5}, queued)
    p.wait_metric("edgespec_queue_depth", 1)  # and the second one waits behind it
    t_term = time.monotonic()
    p.p.send_signal(signal.SIGTERM)
    assert p.wait(30) == 0
    t1.join(5), t2.join(5)
    assert p.notify.wait_for("STOPPING=1", timeout=1) >= t_term
    # the running request finished completely
    assert running["status"] == 200 and running["raw"].endswith("data: [DONE]\n\n")
    events = [json.loads(b[6:]) for b in running["raw"].split("\n\n") if b.startswith("data: {")]
    assert events[-1]["choices"][0]["finish_reason"] == "length" and events[-1]["usage"]["completion_tokens"] == 60
    # the queued one was told to come back
    assert queued["status"] == 503 and json.loads(queued["raw"])["error"]["code"] == "shutting_down"
    log = "\n".join(p.lines)
    assert "SIGTERM: draining" in log and "status=503" in log and "\x1b[" not in log


def test_sigterm_cancels_the_running_request_at_the_drain_deadline(proc, tiny_bundle):
    p = proc(tiny_bundle, "--drain-timeout", "0.5", env={**HOOKS, "EDGESPEC_TEST_TOKEN_DELAY": "0.05"})
    p.wait_port()
    p.notify.wait_for("READY=1")
    running = {}
    t1 = _stream_in_background(p, {"messages": MSG, "max_tokens": 200, "stream": True}, running)
    p.wait_metric("edgespec_busy", 1)
    p.p.send_signal(signal.SIGTERM)
    assert p.wait(30) == 0  # 200 tokens x 0.05 s would be 10 s: it exits because the deadline cut the request
    t1.join(5)
    assert running["status"] == 200 and running["raw"].endswith("data: [DONE]\n\n")
    error = [json.loads(b[6:]) for b in running["raw"].split("\n\n") if b.startswith("data: {")][-1]
    assert error["error"]["code"] == "shutting_down"


def test_corrupt_bundle_exits_78_with_one_clear_line(proc, tiny_bundle, bundle_copy):
    b = bundle_copy(tiny_bundle)
    onnx = next((b / "target").glob("*.onnx*"))
    data = bytearray(onnx.read_bytes())
    data[len(data) // 2] ^= 0xFF
    onnx.write_bytes(bytes(data))
    p = proc(b)
    assert p.wait(60) == 78
    errors = [line for line in p.lines if line.startswith("edgespec serve: error:")]
    assert len(errors) == 1 and "failed verification" in errors[0]
    assert any("sha256" in line for line in p.lines)
    assert p.notify.count("READY=1") == 0


def test_missing_bundle_and_bad_options_exit_78(proc, tmp_path, tiny_bundle):
    p = proc(tmp_path / "nope", notify=False)
    assert p.wait(30) == 78 and "does not exist" in "\n".join(p.lines)
    p = proc(tiny_bundle, "--request-timeout", "0", notify=False)
    assert p.wait(30) == 78 and "request timeout must be > 0" in "\n".join(p.lines)
    p = proc(tiny_bundle, notify=False, env={"EDGESPEC_QUEUE_SIZE": "many"})
    assert p.wait(30) == 78 and "EDGESPEC_QUEUE_SIZE" in "\n".join(p.lines)


def test_port_in_use_is_a_clear_error(tiny_bundle):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    try:
        port = s.getsockname()[1]
        e = {k: v for k, v in os.environ.items() if not k.startswith("EDGESPEC_")}
        r = subprocess.run([sys.executable, "-m", "edgespec", "serve", str(tiny_bundle), "--port", str(port)],
                           env=e, capture_output=True, text=True, timeout=60)
        assert r.returncode == 78
        assert f"cannot listen on 127.0.0.1:{port}" in r.stderr and "another server" in r.stderr
    finally:
        s.close()


def test_environment_file_settings_and_journal_priorities(proc, tiny_bundle, tmp_path):
    """The unit passes settings as EDGESPEC_* variables; under journald lines carry <priority>."""
    key = tmp_path / "key"
    key.write_text("journal-0123456789abcdef")
    key.chmod(0o600)
    p = proc(tiny_bundle, env={"EDGESPEC_MODEL_NAME": "coder,alias", "EDGESPEC_API_KEY_FILE": str(key),
                               "EDGESPEC_DEFAULT_MAX_TOKENS": "3", "JOURNAL_STREAM": "8:1234"})
    p.wait_port()
    p.notify.wait_for("READY=1")
    status, _ = p.post("/v1/chat/completions", {"messages": MSG})
    assert status == 401
    req = urllib.request.Request(p.url("/v1/chat/completions"), method="POST",
                                 data=json.dumps({"model": "alias", "messages": MSG}).encode(),
                                 headers={"Authorization": "Bearer journal-0123456789abcdef",
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        body = json.loads(r.read())
    assert body["model"] == "alias" and body["usage"]["completion_tokens"] == 3
    p.p.send_signal(signal.SIGUSR2)  # without the test hooks: logged and ignored, not an abrupt death
    _wait_line(p, "SIGUSR2 ignored")
    p.p.send_signal(signal.SIGTERM)
    assert p.wait() == 0
    assert all(re.match(r"<[0-7]>", line) for line in p.lines if line), p.lines
    assert any(line.startswith("<6>edgespec.server.requests: req=chatcmpl-") and "status=200" in line
               for line in p.lines)


def test_cli_help_and_no_bundle(monkeypatch, capsys):
    from edgespec.cli.main import main

    for k in [k for k in os.environ if k.startswith("EDGESPEC_")]:
        monkeypatch.delenv(k)
    with pytest.raises(SystemExit) as ei:
        main(["serve", "--help"])
    assert ei.value.code == 0
    out = capsys.readouterr().out
    assert "--api-key-file" in out and "[EDGESPEC_HOST]" in out and "--memory-budget" in out
    assert main(["serve"]) == 78
    assert "no bundle given" in capsys.readouterr().err


def _wait_line(p, text, timeout=30):
    def logged():
        if text in "\n".join(p.lines):
            return True
        assert p.p.poll() is None, f"the server exited without {text!r} in the log:\n" + "\n".join(p.lines)
        return False

    wait_for(f"{text!r} in the server log", logged, timeout=timeout, every=0.02, detail=lambda: "\n".join(p.lines))


def _wait_busy(p, key, timeout=30):
    """Until /metrics (read with the key) says a request is generating."""
    def busy():
        req = urllib.request.Request(p.url("/metrics"), headers={"Authorization": f"Bearer {key}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            return "\nedgespec_busy 1\n" in r.read().decode()

    wait_for("a request generating (edgespec_busy 1)", busy, timeout=timeout, every=0.02)


def _status_with_key(p, key):
    req = urllib.request.Request(p.url("/v1/models"), headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_sighup_reloads_the_key_and_usr1_is_ignored_mid_stream(proc, tiny_bundle, tmp_path):
    """SIGHUP and SIGUSR1 used to kill the server where it stood (the stream cut, nothing logged).
    Now a stream in flight finishes normally through both, SIGHUP puts a rewritten key file in force,
    and the server stays up. (SIGUSR2 is the hang hook here, with the test hooks on; without them it
    is ignored: test_environment_file_settings_and_journal_priorities.)"""
    keyfile = tmp_path / "key"
    old, new = "old-key-0123456789abcdef", "new-key-0123456789abcdef"
    keyfile.write_text(old)
    keyfile.chmod(0o600)
    p = proc(tiny_bundle, "--api-key-file", str(keyfile), env={**HOOKS, "EDGESPEC_TEST_TOKEN_DELAY": "0.03"})
    p.wait_port()
    p.notify.wait_for("READY=1")
    running = {}
    t = _stream_in_background(p, {"messages": MSG, "max_tokens": 300, "stream": True}, running,
                              {"Authorization": f"Bearer {old}"})  # 300 x 0.03 s: the signals land mid-stream
    keyfile.write_text(new)
    _wait_busy(p, old)
    for sig in (signal.SIGHUP, signal.SIGUSR1):
        p.p.send_signal(sig)
    _wait_line(p, "SIGUSR1 ignored")
    _wait_line(p, "SIGHUP: API key reloaded from")
    assert t.is_alive(), "the stream ended before the signals were handled: not a mid-stream test"
    t.join(120)
    assert running["status"] == 200 and running["raw"].endswith("data: [DONE]\n\n"), running
    events = [json.loads(b[6:]) for b in running["raw"].split("\n\n") if b.startswith("data: {")]
    assert events[-1]["choices"][0]["finish_reason"] == "length" and events[-1]["usage"]["completion_tokens"] == 300
    assert p.p.poll() is None
    assert _status_with_key(p, new) == 200 and _status_with_key(p, old) == 401
    log = "\n".join(p.lines)
    assert "SIGHUP: API key reloaded from" in log and "(changed)" in log and "SIGUSR1 ignored" in log
    keyfile.write_text("short")  # a bad file on the next SIGHUP: logged, the key in force stays
    p.p.send_signal(signal.SIGHUP)
    _wait_line(p, "previous one stays in force")
    assert _status_with_key(p, new) == 200
    p.p.send_signal(signal.SIGTERM)
    assert p.wait() == 0


def test_second_sigterm_cancels_now_and_the_stream_still_ends_with_done(proc, tiny_bundle):
    p = proc(tiny_bundle, "--drain-timeout", "60", env={**HOOKS, "EDGESPEC_TEST_TOKEN_DELAY": "0.05"})
    p.wait_port()
    p.notify.wait_for("READY=1")
    running = {}
    t = _stream_in_background(p, {"messages": MSG, "max_tokens": 500, "stream": True}, running)
    p.wait_metric("edgespec_busy", 1)
    p.p.send_signal(signal.SIGTERM)
    _wait_line(p, "SIGTERM: draining")
    p.p.send_signal(signal.SIGTERM)
    assert p.wait(30) == 0  # 500 tokens x 0.05 s would be 25 s; the drain allows 60: it was the second signal
    t.join(10)
    assert running["status"] == 200 and running["raw"].endswith("data: [DONE]\n\n"), running
    last = [json.loads(b[6:]) for b in running["raw"].split("\n\n") if b.startswith("data: {")][-1]
    assert last["error"]["code"] == "shutting_down"
