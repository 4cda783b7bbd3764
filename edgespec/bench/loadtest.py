"""`edgespec loadtest`: N concurrent streaming clients over the HTTP API, against the serial server
(`--parallel 1`: one slot, requests queue) and the batched one (`--parallel N`), in one run. Both are
the same server and the same engine (Engine.open), with 1 or N cache slots.

Each configuration serves the same requests: the prompt set's first `requests` prompts, taken from a
shared list by `concurrency` client threads (closed loop: a client sends its next request when its
last one ended). Reported per (server, drafting, concurrency):
    aggregate tok/s   completion tokens of every request / wall time from the first request sent
                      to the last one finished (what the board delivers)
    decode tok/s      the same without prompt reading: tokens after each request's first / (wall
                      time - the time the board spent in prompt passes, summed over requests).
                      Both servers read every prompt at the same cost, one prompt at a time, so
                      this is the figure batching can change (it saves the fixed part of a step)
    per-request tok/s mean of each request's decode rate (what one user sees while streaming)
    TTFT p50 / p95    request sent -> first content chunk, queue wait included
The servers run in this process on a free loopback port, one after the other (never both loaded).
With `--url` the same clients measure a server that is already running (llama.cpp's llama-server,
say) instead: several runs with different --label values and one JSON file each compare them.
"""
from __future__ import annotations

import http.client
import json
import signal
import statistics
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

from ..errors import InvalidRequest


@dataclass
class ClientRun:
    ttft_s: float
    tokens: int
    seconds: float
    decode_tps: float
    batch_size_mean: float = 1.0
    prefill_s: float = 0.0


@dataclass
class LoadResult:
    server: str  # "serial" | "batched"
    draft: str
    concurrency: int
    requests: int = 0
    tokens: int = 0
    wall_s: float = 0.0
    aggregate_tps: float = 0.0
    decode_tps: float = 0.0
    per_request_tps: float = 0.0
    ttft_p50: float = 0.0
    ttft_p95: float = 0.0
    batch_size_mean: float = 1.0
    runs: list[ClientRun] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("runs")
        return d


def _percentile(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    xs = sorted(xs)
    i = min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))
    return xs[i]


@dataclass(frozen=True)
class Target:
    """Where the clients send their requests: a loopback port, or a server given by URL."""

    host: str = "127.0.0.1"
    port: int = 0
    prefix: str = ""  # path before /v1/...


def parse_url(url: str) -> Target:
    """`http://HOST:PORT` (an optional path prefix before /v1) of an OpenAI-compatible server."""
    from urllib.parse import urlsplit

    try:
        u = urlsplit(url)
        port = u.port
    except ValueError:
        port, u = None, None
    if u is None or u.scheme != "http" or not u.hostname or port is None or u.query or u.fragment:
        raise InvalidRequest(f"--url must look like http://127.0.0.1:8080 (plain http, host and port), got {url!r}",
                             param="url")
    prefix = u.path.rstrip("/")
    if prefix.endswith("/v1"):
        prefix = prefix[:-3]
    return Target(u.hostname, port, prefix)


def stream_request(target: int | Target, body: dict, timeout: float = 600.0) -> ClientRun:
    """One streaming chat request over plain HTTP; returns what the client saw. Tokens are the
    server's `usage.completion_tokens`, else the content chunks counted (one token each, as
    llama.cpp's server streams them)."""
    t = target if isinstance(target, Target) else Target(port=target)
    data = json.dumps({**body, "stream": True, "stream_options": {"include_usage": True}}).encode()
    conn = http.client.HTTPConnection(t.host, t.port, timeout=timeout)
    t0 = time.perf_counter()
    ttft = None
    tokens = 0
    chunks = 0
    stats: dict = {}
    try:
        conn.request("POST", t.prefix + "/v1/chat/completions", body=data,
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"the server answered {resp.status}: {resp.read()[:300]!r}")
        buf = b""
        while True:
            chunk = resp.read1(65536)
            if not chunk:
                break
            buf += chunk
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                if not event.startswith(b"data: ") or event == b"data: [DONE]":
                    continue
                msg = json.loads(event[6:])
                if "error" in msg:
                    raise RuntimeError(f"the stream ended with an error: {msg['error']}")
                for c in msg.get("choices") or []:
                    if (c.get("delta") or {}).get("content"):
                        chunks += 1
                        if ttft is None:
                            ttft = time.perf_counter() - t0
                if msg.get("usage"):
                    tokens = msg["usage"].get("completion_tokens", tokens)
                if msg.get("edgespec"):
                    stats = msg["edgespec"]
    finally:
        conn.close()
    seconds = time.perf_counter() - t0
    tokens = tokens or chunks
    return ClientRun(ttft if ttft is not None else seconds, tokens, seconds,
                     float(stats.get("decode_tokens_per_second") or 0.0), float(stats.get("batch_size_mean") or 1.0),
                     float(stats.get("prefill_s") or 0.0))


def run_clients(target: int | Target, bodies: list[dict], concurrency: int, *, server: str, draft: str) -> LoadResult:
    """`concurrency` client threads work through `bodies` (closed loop)."""
    todo = list(reversed(bodies))
    lock = threading.Lock()
    runs: list[ClientRun] = []
    errors: list[BaseException] = []

    def client() -> None:
        while True:
            with lock:
                if not todo or errors:
                    return
                body = todo.pop()
            try:
                r = stream_request(target, body)
            except BaseException as e:  # noqa: BLE001 - reported after the threads end
                with lock:
                    errors.append(e)
                return
            with lock:
                runs.append(r)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise errors[0]
    res = LoadResult(server, draft, concurrency, len(runs), sum(r.tokens for r in runs), wall, runs=runs)
    res.aggregate_tps = res.tokens / wall if wall > 0 else 0.0
    decode_wall = wall - sum(r.prefill_s for r in runs)
    decode_tokens = sum(max(0, r.tokens - 1) for r in runs)
    res.decode_tps = decode_tokens / decode_wall if decode_wall > 0 else 0.0
    res.per_request_tps = statistics.fmean([r.decode_tps for r in runs]) if runs else 0.0
    ttfts = [r.ttft_s for r in runs]
    res.ttft_p50, res.ttft_p95 = _percentile(ttfts, 0.5), _percentile(ttfts, 0.95)
    res.batch_size_mean = statistics.fmean([r.batch_size_mean for r in runs]) if runs else 1.0
    return res


@dataclass
class Served:
    """A server run by `serve`: its port, and its engine (to forget what earlier levels taught)."""

    port: int
    engine: Any

    def forget(self) -> None:
        """Empties the engine's caches and what its drafters learned (the suffix index, the recycle
        table, n-gram estimates), between levels: every level sends the same prompts, and a server
        that had answered them before would copy its own earlier answers."""
        self.engine.reset_cache()


@contextmanager
def serve(bundle: str | Path, *, parallel: int, engine_options: dict) -> Iterator[Served]:
    """`edgespec serve` in this process on a free loopback port."""
    from ..server.config import ServerConfig
    from ..server.sdnotify import Notifier
    from ..server.service import Hooks, Service

    from ..engine.settings import Settings

    settings = Settings.of(**engine_options, parallel=parallel)  # checked here, before the server starts

    def open_engine():
        from ..engine import Engine

        return Engine.open(bundle, settings)  # one engine: `parallel` slots

    cfg = ServerConfig(port=0, parallel=parallel, queue_size=64, request_timeout=3600.0, max_tokens_limit=100000)
    svc = Service(cfg, open_engine, default_name=Path(bundle).name, notifier=Notifier(environ={}), hooks=Hooks())
    th = threading.Thread(target=svc.run, name="loadtest-server", daemon=True)
    th.start()
    end = time.monotonic() + 900
    while svc.state.phase != "ready":
        if svc.state.phase == "failed" or not th.is_alive():
            raise RuntimeError(f"the server did not start: {svc.state.failure}")
        if time.monotonic() > end:
            raise RuntimeError("the server did not become ready within 900 s")
        time.sleep(0.05)
    try:
        yield Served(svc.port, svc.state.engine)
    finally:
        svc.on_signal(signal.SIGTERM)
        th.join(120)


def parse_levels(text: str) -> list[int]:
    try:
        levels = sorted({int(x) for x in str(text).split(",") if x.strip()})
    except ValueError:
        raise InvalidRequest(f"--concurrency must be integers joined by commas, e.g. 1,2,4; got {text!r}",
                             param="concurrency") from None
    if not levels or levels[0] < 1 or levels[-1] > 64:
        raise InvalidRequest(f"--concurrency levels must be from 1 to 64, got {text!r}", param="concurrency")
    return levels


def chat_bodies(prompts: str, requests: int, max_tokens: int, **extra) -> list[dict]:
    """The prompt set's first `requests` prompts as greedy streaming chat request bodies."""
    from .prompts import load_prompts

    if requests < 1:
        raise InvalidRequest("--requests must be >= 1", param="requests")
    bodies = [{**p.request(), "max_tokens": max_tokens, "temperature": 0, **extra}
              for p in load_prompts(prompts)[:requests]]
    if any("prompt" in b for b in bodies):
        raise InvalidRequest("loadtest sends chat requests: raw prompts are not supported", param="prompts")
    return bodies


def warm(target: int | Target, bodies: list[dict]) -> None:
    """One short request first: the whole request path is warm before anything is timed."""
    stream_request(target, {**bodies[0], "max_tokens": 4})


def run_levels(target: int | Target, bodies: list[dict], levels: list[int], *, server: str, draft: str,
               before_level=None, progress=None) -> list[LoadResult]:
    """Every concurrency level in turn (`before_level` runs before each)."""
    out = []
    for c in levels:
        if before_level is not None:
            before_level()
        r = run_clients(target, bodies, c, server=server, draft=draft)
        out.append(r)
        if progress:
            progress(r)
    return out


def loadtest(bundle: str | Path, *, levels: list[int], drafts: list[str], prompts: str = "code", requests: int = 8,
             max_tokens: int = 64, engine_options: dict | None = None, progress=None) -> list[LoadResult]:
    out: list[LoadResult] = []
    for draft in drafts:
        bodies = chat_bodies(prompts, requests, max_tokens, draft=draft)
        opts = {**(engine_options or {}), "draft": draft}
        for server, parallel in (("serial", 1), ("batched", max(levels))):
            with serve(bundle, parallel=parallel, engine_options=opts) as served:
                warm(served.port, bodies)
                out += run_levels(served.port, bodies, levels, server=server, draft=draft,
                                  before_level=served.forget, progress=progress)
    return out


def loadtest_url(url: str, *, levels: list[int], prompts: str = "code", requests: int = 8, max_tokens: int = 64,
                 label: str = "external", progress=None) -> list[LoadResult]:
    """The same clients against a server already running at `url` (llama.cpp's llama-server, another
    edgespec): no draft field is sent, the server drafts as it was started. Its prompt time is not
    known here, so its decode tok/s counts the whole wall time. Its caches cannot be emptied from here:
    for levels that do not profit from earlier ones, restart it and run one level at a time."""
    target = parse_url(url)
    bodies = chat_bodies(prompts, requests, max_tokens)
    try:
        warm(target, bodies)
    except OSError as e:
        raise InvalidRequest(f"no server answers at {url}: {e}", param="url") from None
    return run_levels(target, bodies, levels, server=label, draft="server", progress=progress)


def report(results: list[LoadResult]) -> str:
    serial = {(r.draft, r.concurrency): r for r in results if r.server == "serial"}
    lines = [f"{'server':8} {'draft':6} {'clients':>7} {'agg tok/s':>9} {'vs serial':>9} {'decode tok/s':>12} "
             f"{'vs serial':>9} {'req tok/s':>9} {'TTFT p50':>8} {'TTFT p95':>8} {'batch':>5} {'tokens':>6}"]

    def ratio(x: float, base: float | None) -> str:
        return f"{x / base:.2f}x" if base else "-"

    for r in results:
        base = serial.get((r.draft, r.concurrency))
        agg = ratio(r.aggregate_tps, base.aggregate_tps if base else None)
        dec = ratio(r.decode_tps, base.decode_tps if base else None)
        lines.append(f"{r.server:8} {r.draft:6} {r.concurrency:>7} {r.aggregate_tps:>9.2f} {agg:>9} "
                     f"{r.decode_tps:>12.2f} {dec:>9} {r.per_request_tps:>9.2f} {r.ttft_p50:>7.2f}s "
                     f"{r.ttft_p95:>7.2f}s {r.batch_size_mean:>5.2f} {r.tokens:>6}")
    return "\n".join(lines)
