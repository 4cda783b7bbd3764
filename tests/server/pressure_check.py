"""Does a streaming completion keep its pace while other clients flood /v1/embeddings or POST /v1/docs/reload?
A measurement, not a test (timings): docs/server.md quotes its output.

    python tests/server/pressure_check.py BUNDLE --embedder all-minilm-l6-v2 --docs INDEX [--rounds 3]

Starts `edgespec serve BUNDLE --embedder E --docs INDEX` and, per round, streams the same greedy completion
(/v1/completions: the documents are not consulted for a plain prompt) three times: quiet, while 4 client
processes send maximal embeddings requests in a loop (each honouring Retry-After), and while 4 processes
POST /v1/docs/reload in a loop. Prints each stream's median gap between streamed pieces, the medians per
condition over all rounds, their ratio to quiet, and the flood's status codes.
"""
from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time

PROMPT = "def parse_csv_line(line: str) -> list[str]:\n    \"\"\"Split one CSV line into fields, handling quotes.\"\"\"\n"
TEXT = ("The harbour museum opens at ten and closes at five; its lighthouse tower has one hundred and thirteen steps, "
        "and the cafe on the ground floor serves crab sandwiches, scones and tea until half past four every day. ")


def _post(port: int, path: str, body: dict, timeout: float = 300.0):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.getheader("Retry-After"), resp.read()
    finally:
        conn.close()


def flood(port: int, kind: str, model: str, stop, counts) -> None:
    """One client process: maximal requests in a loop until `stop`; a 429 waits its Retry-After."""
    body = {"model": model, "input": [TEXT * 2 + str(i) for i in range(80)]} if kind == "embeddings" else {}
    path = "/v1/embeddings" if kind == "embeddings" else "/v1/docs/reload"
    while not stop.is_set():
        try:
            status, retry, _ = _post(port, path, body)
        except OSError:
            status, retry = 0, None
        with counts.get_lock():
            counts[{200: 0, 429: 1, 413: 2}.get(status, 3)] += 1
        if status == 429:
            stop.wait(float(retry or 1))


def stream_gaps(port: int, max_tokens: int) -> list[float]:
    """Seconds between the streamed pieces of one greedy completion (time to the first piece left out)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    conn.request("GET", "/v1/models")
    model = json.loads(conn.getresponse().read())["data"][0]["id"]
    conn.request("POST", "/v1/completions", json.dumps({"model": model, "prompt": PROMPT, "max_tokens": max_tokens,
                                                        "temperature": 0, "stream": True, "draft": "none"}),
                 {"Content-Type": "application/json"})
    resp = conn.getresponse()
    times, last = [], b""
    for line in resp:  # one event a line ("data: {...}"), then a blank line
        if line.startswith(b"data: {") and b'"text":""' not in line:
            times.append(time.monotonic())
        last = line or last
    conn.close()
    if len(times) < 2:
        raise RuntimeError(f"the stream sent {len(times)} pieces: {last[:300]!r}")
    return [b - a for a, b in zip(times, times[1:])]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle")
    ap.add_argument("--embedder", required=True)
    ap.add_argument("--docs", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--clients", type=int, default=4)
    args = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"}
    p = subprocess.Popen([sys.executable, "-m", "edgespec", "serve", args.bundle, "--port", "0", "--embedder",
                          args.embedder, "--docs", args.docs, "--no-verify"], env=env, stderr=subprocess.PIPE,
                         stdout=subprocess.DEVNULL, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(iter(p.stderr.readline, "")), daemon=True).start()
    try:
        port = None
        end = time.monotonic() + 600
        while port is None or not any(" ready: " in x for x in lines):
            if p.poll() is not None or time.monotonic() > end:
                print("".join(lines[-30:]))
                return 1
            m = next((re.search(r"listening on http://127\.0\.0\.1:(\d+)", x) for x in lines if "listening on" in x), None)
            port = int(m.group(1)) if m else None
            time.sleep(0.2)
        status, _, raw = _post(port, "/v1/embeddings", {"model": args.embedder, "input": "warm up"})
        if status != 200:
            print(f"the embedder does not answer: {status} {raw[:300]!r}")
            return 1
        tokens = json.loads(_post(port, "/v1/embeddings", {"model": args.embedder, "input": [TEXT * 2 + str(i) for i in range(80)]})[2])
        print(f"a flood request: {tokens.get('usage') or tokens}")
        stream_gaps(port, 8)  # warm
        medians: dict[str, list[float]] = {"quiet": [], "embeddings": [], "reload": []}
        for r in range(args.rounds):
            for cond in medians:
                stop, counts, procs = mp.Event(), mp.Array("i", 4), []
                if cond != "quiet":
                    procs = [mp.Process(target=flood, args=(port, cond, args.embedder, stop, counts), daemon=True)
                             for _ in range(args.clients)]
                    for q in procs:
                        q.start()
                    time.sleep(3.0)  # the flood under way (queue full) before the stream starts
                gaps = stream_gaps(port, args.max_tokens)
                stop.set()
                for q in procs:
                    q.join(120)
                med = statistics.median(gaps) * 1000
                medians[cond].append(med)
                extra = f"  flood: {counts[0]} x 200, {counts[1]} x 429, {counts[2]} x 413, {counts[3]} other" if procs else ""
                print(f"round {r + 1} {cond:10s} median gap {med:6.1f} ms over {len(gaps)} gaps, p90 "
                      f"{statistics.quantiles(gaps, n=10)[-1] * 1000:6.1f} ms{extra}", flush=True)
        quiet = statistics.median(medians["quiet"])
        for cond, ms in medians.items():
            print(f"{cond:10s} median of medians {statistics.median(ms):6.1f} ms  ({statistics.median(ms) / quiet:.2f}x quiet)")
        return 0
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(60)


if __name__ == "__main__":
    sys.exit(main())
