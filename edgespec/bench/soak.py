"""A long soak of `edgespec serve`: does its memory stop growing once everything it keeps is full?

    python -m edgespec.bench.soak DURATION --bundle BUNDLE     (scripts/soak.sh builds a tiny bundle first)

The server runs as a process of its own (`serve --parallel 2`, a small `--suffix-capacity` so the suffix
history fills in a minute or two), driven by loadtest's streaming clients (bench/loadtest.py) with
sampled, seeded requests, so every answer is new text for the history and every conversation a new
entry for the caches. Every SAMPLE_EVERY seconds /metrics is read: resident memory, the suffix indexes'
tokens and evictions, the caches' entries (server/metrics.py memory_gauges). The curve is printed as it
goes, one line a sample.

Verdict: capacity is reached at the first sample where the suffix indexes have evicted (they are
full). The samples after it are split in halves; the run fails
when the later half's highest RSS is over the earlier half's by more than NOISE_MIB (RSS still growing
with nothing left to fill), when the RSS of the run's last third climbs steadily (its least-squares slope
against requests over SLOPE_MIB_PER_1000 MiB per 1,000 requests, and its fitted rise over the third more
than a quarter of NOISE_MIB: a slow leak that the halves' peaks could hide; only samples after capacity), when the suffix index's own bytes
keep climbing past its capacity (its automaton must settle into a bounded swing of rebuilds), when
capacity is never reached, or when any request fails. Numbers are bytes and counts; the duration only
decides how long the evidence is.

Why a server's RSS grows for a long while before it is flat: the suffix index keeps finished requests'
text up to --suffix-capacity tokens (1,048,576 by default, ~244 bytes a token held: limits.py), so at the
default a server adds ~24 MiB per 1,000 answers of ~100 tokens until it holds a million tokens (~10,000
such answers), then evicts. The soak serves a small capacity so that point comes within minutes.
"""
from __future__ import annotations

import argparse
import http.client
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

SAMPLE_EVERY = 5.0  # seconds between /metrics reads
NOISE_MIB = 8.0  # RSS the later half may add over the earlier one: allocator arenas and free lists settling
# RSS slope the run's last third may show (MiB per 1,000 requests): a leak of 1 KiB a request is 1 MiB per 1,000;
# the 5-minute soak at the default capacity showed 28 (the suffix index filling, module docstring)
SLOPE_MIB_PER_1000 = 1.0
MIN_AFTER = 4  # samples needed after capacity is reached for a verdict
CAPACITY = 4096  # --suffix-capacity of the soaked server: tokens, full after a few hundred requests
WORDS = ("Write a haiku about the sea.", "List three fruits.", "What is a prime number?", "Say hello in French.",
         "Name a planet.", "Count to five.", "Describe a cat.", "Why is the sky blue?", "Give me a word that rhymes with tree.")
GAUGES = ("resident_memory_bytes", "suffix_index_tokens", "suffix_index_capacity_tokens", "suffix_index_evicted_tokens",
          "suffix_index_bytes", "template_cache_entries")


@dataclass
class Sample:
    seconds: float
    requests: int
    gauges: dict[str, float]

    @property
    def rss_mib(self) -> float:
        return self.gauges["resident_memory_bytes"] / (1 << 20)

    @property
    def full(self) -> bool:
        g = self.gauges
        return g["suffix_index_evicted_tokens"] > 0

    def line(self) -> str:
        g = self.gauges
        return (f"{self.seconds:7.0f} s {self.requests:7d} req  rss {self.rss_mib:7.1f} MiB  suffix "
                f"{g['suffix_index_tokens']:.0f}/{g['suffix_index_capacity_tokens']:.0f} tokens "
                f"({g['suffix_index_bytes'] / (1 << 20):.1f} MiB, {g['suffix_index_evicted_tokens']:.0f} evicted)  "
                f"templates {g['template_cache_entries']:.0f}" + ("  [full]" if self.full else ""))


def parse_duration(text: str) -> float:
    """'90s', '10m', '2h', '1h30m' or plain seconds -> seconds (> 0)."""
    parts = re.fullmatch(r"\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s?)?\s*", text or "")
    if not parts or not any(parts.groups()):
        raise ValueError(f"DURATION must look like 90s, 10m, 2h or 1h30m, got {text!r}")
    h, m, s = (float(x) if x else 0.0 for x in parts.groups())
    total = h * 3600 + m * 60 + s
    if total <= 0:
        raise ValueError(f"DURATION must be more than 0, got {text!r}")
    return total


def verdict(samples: list[Sample], noise_mib: float = NOISE_MIB) -> tuple[bool, str]:
    """(passed, one line saying why): see the module docstring."""
    first = next((i for i, s in enumerate(samples) if s.full), None)
    if first is None:
        last = samples[-1].line() if samples else "no sample"
        return False, f"capacity was not reached (last: {last.strip()}): run longer or lower --suffix-capacity"
    after = samples[first:]
    if len(after) < MIN_AFTER:
        return False, (f"only {len(after)} samples after capacity was reached at {after[0].seconds:.0f} s "
                       f"(at least {MIN_AFTER}): run longer")
    half = len(after) // 2
    early, late = max(s.rss_mib for s in after[:half]), max(s.rss_mib for s in after[half:])
    requests = max(after[-1].requests - after[0].requests, 1)
    per_1000 = (after[-1].rss_mib - after[0].rss_mib) / requests * 1000
    said = (f"after capacity (reached at {after[0].seconds:.0f} s, {after[0].requests} requests): RSS highest "
            f"{early:.1f} MiB in the earlier half, {late:.1f} MiB in the later; {per_1000:+.2f} MiB per 1,000 "
            f"requests over {requests} requests")
    slope, rise, n_last = fitted_slope(samples[max(first, len(samples) - len(samples) // 3):])
    said += (f"; last third of the run: {slope:+.2f} MiB per 1,000 requests (bound {SLOPE_MIB_PER_1000:g}), "
             f"{rise:+.1f} MiB fitted over its {n_last} requests")
    if late - early > noise_mib:
        return False, f"RSS still growing {said} (over the {noise_mib:g} MiB noise)"
    if slope > SLOPE_MIB_PER_1000 and rise > noise_mib / 4:
        return False, f"RSS climbing steadily {said}"
    index_early = max(s.gauges["suffix_index_bytes"] for s in after[:half]) / (1 << 20)
    index_late = max(s.gauges["suffix_index_bytes"] for s in after[half:]) / (1 << 20)
    if index_late > 1.5 * index_early + 1:  # its automaton swings with each rebuild, within a bound
        return False, (f"the suffix index still growing past its capacity: highest {index_early:.1f} MiB in the "
                       f"earlier half, {index_late:.1f} MiB in the later ({said})")
    return True, f"RSS flat {said}"


def fitted_slope(samples: list[Sample]) -> tuple[float, float, int]:
    """(MiB per 1,000 requests, MiB risen by the fit, requests): RSS fitted by least squares against the
    request count over `samples` (verdict: the run's last third)."""
    xs = [s.requests for s in samples]
    ys = [s.rss_mib for s in samples]
    if len(xs) < 2:
        return 0.0, 0.0, 0
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    per_request = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var > 0 else 0.0
    span = max(xs) - min(xs)
    return per_request * 1000, per_request * span, span


class _Server:
    def __init__(self, bundle: str, parallel: int, capacity: int, max_len: int):
        env = {k: v for k, v in os.environ.items() if not k.startswith("EDGESPEC_") and k != "NOTIFY_SOCKET"}
        env["PYTHONUNBUFFERED"] = "1"
        self.p = subprocess.Popen(
            [sys.executable, "-m", "edgespec", "serve", bundle, "--port", "0", "--parallel", str(parallel),
             "--suffix-capacity", str(capacity), "--max-len", str(max_len), "--no-warmup", "--no-verify"],
            env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.port = self._wait(self._port, "its 'listening on' line")
        self._wait(lambda: self.get("/ready")[0] == 200, "/ready")

    def _read(self) -> None:
        for line in self.p.stderr:
            self.lines.append(line.rstrip("\n"))

    def _wait(self, fn, what: str, timeout: float = 180.0):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.p.poll() is not None:
                raise RuntimeError("the server exited:\n" + "\n".join(self.lines[-30:]))
            try:
                got = fn()
            except OSError:
                got = None
            if got:
                return got
            time.sleep(0.1)
        raise RuntimeError(f"the server did not show {what} within {timeout:g} s:\n" + "\n".join(self.lines[-30:]))

    def _port(self) -> int | None:
        m = next((m for m in (re.search(r"listening on http://127\.0\.0\.1:(\d+)", x) for x in list(self.lines)) if m),
                 None)
        return int(m.group(1)) if m else None

    def get(self, path: str) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def gauges(self) -> dict[str, float]:
        status, text = self.get("/metrics")
        if status != 200:
            raise RuntimeError(f"/metrics answered {status}")
        found = {m[1]: float(m[2]) for m in re.finditer(r"^edgespec_(\w+) ([-+0-9.e]+)$", text.decode(), re.M)}
        missing = [g for g in GAUGES if g not in found]
        if missing:
            raise RuntimeError(f"/metrics lacks {', '.join('edgespec_' + g for g in missing)}")
        return found

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(60)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


def soak(bundle: str, seconds: float, *, parallel: int = 2, capacity: int = CAPACITY, max_len: int = 256,
         every: float = SAMPLE_EVERY, noise_mib: float = NOISE_MIB, out=print) -> bool:
    from .loadtest import run_clients

    server = _Server(bundle, parallel, capacity, max_len)
    samples: list[Sample] = []
    done = {"requests": 0}
    errors: list[BaseException] = []
    stop = threading.Event()
    t0 = time.monotonic()

    def load() -> None:
        round_ = 0
        while not stop.is_set():
            # short chats, sampled with a new seed each round: new answers for the history, new conversations
            # for the caches (and short enough for a tiny bundle's cache)
            bodies = [{"messages": [{"role": "user", "content": f"{WORDS[(round_ + i) % len(WORDS)]} {round_}.{i}"}],
                       "temperature": 0.8, "seed": round_ * 1000 + i, "max_tokens": 32} for i in range(8)]
            try:
                r = run_clients(server.port, bodies, parallel, server="soak", draft="auto")
            except BaseException as e:  # noqa: BLE001 - reported as the verdict
                errors.append(e)
                return
            done["requests"] += r.requests
            round_ += 1

    worker = threading.Thread(target=load, daemon=True)
    out(f"soak: {bundle}, {seconds:g} s, serve --parallel {parallel} --suffix-capacity {capacity} --max-len {max_len}; "
        f"a sample every {every:g} s")
    try:
        worker.start()
        while True:
            now = time.monotonic() - t0
            samples.append(Sample(now, done["requests"], server.gauges()))
            out(samples[-1].line())
            if now >= seconds or errors or not worker.is_alive():
                break
            stop.wait(min(every, max(seconds - now, 0.0)))
    finally:
        stop.set()
        worker.join(120)
        server.stop()
    if errors:
        out(f"soak: FAILED: a request failed: {type(errors[0]).__name__}: {errors[0]}")
        return False
    if any("Traceback" in line for line in server.lines):
        out("soak: FAILED: the server logged a traceback:\n" + "\n".join(server.lines[-40:]))
        return False
    ok, said = verdict(samples, noise_mib)
    out(f"soak: {'OK' if ok else 'FAILED'}: {said}")
    return ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="soak", description=__doc__.split("\n\n")[0])
    p.add_argument("duration", nargs="?", default="10m", help="how long to drive the server: 90s, 10m, 2h (default 10m)")
    p.add_argument("--bundle", required=True, help="the bundle to serve (scripts/soak.sh builds a tiny one)")
    p.add_argument("--parallel", type=int, default=2)
    p.add_argument("--suffix-capacity", type=int, default=CAPACITY)
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--every", type=float, default=SAMPLE_EVERY, help="seconds between samples")
    p.add_argument("--noise-mib", type=float, default=NOISE_MIB)
    args = p.parse_args(argv)
    try:
        seconds = parse_duration(args.duration)
    except ValueError as e:
        p.error(str(e))
    ok = soak(args.bundle, seconds, parallel=args.parallel, capacity=args.suffix_capacity, max_len=args.max_len,
              every=args.every, noise_mib=args.noise_mib)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
