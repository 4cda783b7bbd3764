"""A soak: `edgespec serve --parallel 2` as a real process under mixed load (greedy, sampled, streamed and
cancelled requests, two clients at a time) for a fixed number of requests on the tiny bundle. Zero errors,
and the server's RSS stops growing once the shared suffix history is full: its growth up to then is what
`plan` counts for it (edge/memory.py: the history's index and the slots' own), and after it, over as many
requests again, nothing beyond allocator noise. Every assertion is on counts and bytes, none on time; every
wait has a deadline that fails loudly."""
from __future__ import annotations

import http.client
import json
import os
import re
import socket
import subprocess
import sys
import threading

import pytest

from edgespec.edge.memory import slot_bytes, suffix_index_bytes
from edgespec.models.bundle import Bundle
from helpers.wait import wait_for

pytest.importorskip("uvicorn", reason="the server extra is not installed (pip install .[server])")

CAPACITY = 2048  # the shared history's tokens (--suffix-capacity): small, so the soak fills it in seconds
MAX_LEN = 256  # each slot's cache (--max-len)
PARALLEL = 2
# RSS the process may gain between two equal phases of load with nothing left to fill: malloc arenas of the
# two request threads and Python's free lists settling (measured on the dev VM: 0-2 MiB between phases)
NOISE_BYTES = 16 << 20
# what one pass of 2 clients x this many requests holds: 4 kinds, so each appears per client per pass
KINDS = ("greedy", "sampled", "streamed", "cancelled")
# after the history is full: 50 x 2 x 4 = 400 requests, so a leak of 40 KB a request shows over the noise
STEADY_PASSES = 50
MAX_FILL_PASSES = 40  # the history must be full well before this (fails loudly otherwise)


class Server:
    def __init__(self, bundle, tmp_path):
        env = {k: v for k, v in os.environ.items() if not k.startswith("EDGESPEC_") and k != "NOTIFY_SOCKET"}
        env["PYTHONUNBUFFERED"] = "1"
        self.p = subprocess.Popen(
            [sys.executable, "-m", "edgespec", "serve", str(bundle), "--port", "0", "--parallel", str(PARALLEL),
             "--suffix-capacity", str(CAPACITY), "--max-len", str(MAX_LEN), "--no-warmup"],
            env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.port = wait_for("the server's 'listening on' line", self._port, timeout=120, every=0.05,
                             detail=lambda: "\n".join(self.lines[-30:]))
        wait_for("/ready 200", lambda: self._get("/ready")[0] == 200, timeout=120, every=0.05,
                 detail=lambda: "\n".join(self.lines[-30:]))

    def _get(self, path: str) -> tuple[int, bytes]:
        assert self.p.poll() is None, "the server exited:\n" + "\n".join(self.lines)
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        conn.request("GET", path)
        resp = conn.getresponse()
        out = resp.status, resp.read()
        conn.close()
        return out

    def _read(self):
        for line in self.p.stderr:
            self.lines.append(line.rstrip("\n"))

    def _port(self):
        assert self.p.poll() is None, "the server exited:\n" + "\n".join(self.lines)
        m = next((m for m in (re.search(r"listening on http://127\.0\.0\.1:(\d+)", x) for x in list(self.lines)) if m),
                 None)
        return int(m.group(1)) if m else None

    def rss(self) -> int:
        with open(f"/proc/{self.p.pid}/status") as f:
            return next(int(x.split()[1]) * 1024 for x in f if x.startswith("VmRSS:"))

    def request(self, body: dict) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        return resp.status, data

    def cancel(self, body: dict) -> bytes:
        """A stream the client drops after its first event (a closed browser tab)."""
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=60)
        data = json.dumps(body).encode()
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(data) + data)
        got = b""
        while b"data: " not in got:
            chunk = sock.recv(4096)
            if not chunk:
                break
            got += chunk
        sock.close()
        return got

    def metrics(self) -> str:
        return self._get("/metrics")[1].decode()

    def stop(self):
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(30)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


def _body(kind: str, client: int, i: int) -> dict:
    words = " ".join(f"w{(client * 7 + i * 3 + j) % 50}" for j in range(8 + i % 5))  # prompts repeat: the history drafts
    body = {"messages": [{"role": "user", "content": words}], "max_tokens": 24 + (i % 3) * 8}
    if kind == "sampled":
        body.update(temperature=0.8, top_p=0.9, seed=i)
    if kind in ("streamed", "cancelled"):
        body.update(stream=True, stream_options={"include_usage": True})
    return body


def _pass(server: Server, n: int, errors: list, tokens: list) -> None:
    """Two clients, each sending one request of every kind; the tokens each finished request held."""
    def client(c: int):
        for k, kind in enumerate(KINDS):
            i = n * len(KINDS) + k
            body = _body(kind, c, i)
            if kind == "cancelled":
                got = server.cancel(body)
                if not got.startswith(b"HTTP/1.1 200"):
                    errors.append((kind, got[:200]))
                continue
            status, data = server.request(body)
            if status != 200 or b'"error"' in data:
                errors.append((kind, status, data[:200]))
                continue
            if kind == "streamed":
                events = [json.loads(x[6:]) for x in data.decode().split("\n\n") if x.startswith("data: {")]
                usage = events[-1]["usage"]
            else:
                usage = json.loads(data)["usage"]
            tokens.append(usage["prompt_tokens"] + usage["completion_tokens"])

    threads = [threading.Thread(target=client, args=(c,)) for c in range(PARALLEL)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
        assert not t.is_alive(), "a client hung for 300 s"


@pytest.mark.slow
def test_serve_parallel_under_mixed_load_has_no_errors_and_stops_growing(tiny_bundle, tmp_path):
    server = Server(tiny_bundle, tmp_path)
    try:
        errors: list = []
        tokens: list[int] = []
        _pass(server, 0, errors, tokens)  # the first requests load what is loaded lazily
        ready = server.rss()
        fill = 1
        while sum(tokens) < 2 * CAPACITY:  # finished requests' text joins the history: full, and turned over
            assert fill < MAX_FILL_PASSES, f"the history did not fill: {sum(tokens)} tokens in {fill} passes"
            _pass(server, fill, errors, tokens)
            fill += 1
        full = server.rss()
        steady_from = len(tokens)
        for n in range(fill, fill + STEADY_PASSES):
            _pass(server, n, errors, tokens)
        end = server.rss()
        metrics = server.metrics()
    finally:
        server.stop()
    assert errors == []
    print(f"soak: rss ready {ready >> 20} MiB, history full {full >> 20} MiB, end {end >> 20} MiB; "
          f"{len(tokens)} finished requests, {fill} fill passes")
    assert len(tokens) - steady_from == STEADY_PASSES * PARALLEL * (len(KINDS) - 1)
    statuses = {m.group(1) for m in re.finditer(r'edgespec_requests_total\{endpoint="chat",status="(\d+)"', metrics)}
    print(f"soak: chat statuses {sorted(statuses)}")
    assert statuses <= {"200", "499"}, metrics  # 499: the cancelled streams, the client gone first
    assert "Traceback" not in "\n".join(server.lines)
    facts = Bundle.open(tiny_bundle, verify=False).target
    planned = suffix_index_bytes(CAPACITY) + PARALLEL * slot_bytes(facts, MAX_LEN)
    assert full - ready <= planned + NOISE_BYTES, (ready, full, planned)
    assert end - full <= NOISE_BYTES, (ready, full, end)


def _gauges(text: str) -> dict[str, float]:
    return {m[1]: float(m[2]) for m in re.finditer(r"^(edgespec_\w+) ([-+0-9.e]+)$", text, re.M)}


def test_metrics_show_resident_memory_and_what_fills_it(tiny_bundle):
    """/metrics reads what soak.sh watches: the process's resident memory, the suffix index against its
    capacity (evicting once full), the conversation cache against its own."""
    from helpers.running import RunningServer

    server = RunningServer(tiny_bundle, engine={"suffix_capacity": 64})
    try:
        for i in range(4):
            server.client.chat.completions.create(model="qwen-agree", max_tokens=24,
                                                  messages=[{"role": "user", "content": f"count to {i + 5}"}])
        conn = http.client.HTTPConnection("127.0.0.1", server.service.port, timeout=60)
        conn.request("GET", "/metrics")
        g = _gauges(conn.getresponse().read().decode())
        conn.close()
    finally:
        server.stop()
    assert g["edgespec_suffix_index_capacity_tokens"] == 64
    assert 0 < g["edgespec_suffix_index_tokens"] <= 64 and g["edgespec_suffix_index_evicted_tokens"] > 0  # 4 x 24+ tokens
    assert g["edgespec_suffix_index_bytes"] >= 64 * 4  # its token buffer at least
    assert "edgespec_conversation_cache_entries" not in g  # a request is tokenized once: nothing to remember
    assert g["edgespec_template_cache_entries"] >= 1 and g["edgespec_template_cache_capacity"] == 8
    assert g["edgespec_resident_memory_bytes"] > 20 << 20  # python, onnxruntime and a model: tens of MiB


@pytest.mark.slow
def test_the_soak_script_shows_rss_flat_once_everything_is_full(tiny_bundle):
    """scripts/soak.sh as a user runs it, for 3 minutes here (10 by default; hours by hand): the curve
    printed a line per sample, capacity reached, and RSS flat after it."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "EDGESPEC_SOAK_BUNDLE": str(tiny_bundle), "PYTHON": sys.executable}
    r = subprocess.run(["bash", os.path.join(root, "scripts", "soak.sh"), "3m", "--every", "10"], env=env,
                       capture_output=True, text=True, timeout=900)
    print(r.stdout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    curve = [x for x in r.stdout.splitlines() if " req  rss " in x]
    assert len(curve) >= 15 and sum("[full]" in x for x in curve) >= 10, r.stdout
    assert r.stdout.splitlines()[-1].startswith("soak: OK: RSS flat after capacity"), r.stdout


def test_the_soak_verdict_reads_the_last_thirds_slope():
    """A leak too slow for the halves' peaks (7 MiB over the run) is caught by the last third's slope; a flat
    run with allocator noise passes, and its line says the slope and its bound."""
    from edgespec.bench.soak import Sample, verdict

    def run(rss_of):
        full = {"suffix_index_evicted_tokens": 1, "suffix_index_bytes": 1 << 20}
        return [Sample(i * 10.0, i * 100, {**full, "resident_memory_bytes": rss_of(i) * (1 << 20)}) for i in range(60)]

    ok, said = verdict(run(lambda i: 300 + (1.5 if i % 3 else 0)))
    assert ok and said.startswith("RSS flat after capacity") and "(bound 1)" in said, said
    ok, said = verdict(run(lambda i: 300 + 7 * i / 59))
    assert not ok and said.startswith("RSS climbing steadily") and "+1.19 MiB per 1,000 requests" in said, said
