"""A peer in the bench: llama.cpp decoding the same GGUF, the same prompts, in the same run.

A speed figure means little alone on a shared or unknown machine; beside another runtime measured
at the same minutes on the same prompts it says whether edgespec's kernels are where they should
be. The peer gets the prompt as the *token ids* edgespec's target got (chat template applied by
edgespec), decodes greedily up to the same number of new tokens, stopping at the same end tokens,
and its decode tokens/s (tokens after the first / time after the first, as edgespec counts) is set
beside each mode. Its tokens are compared with the target's: the two runtimes' 4-bit kernels round
differently, so they agree for a while and then may part at a near-tie; the first difference is
reported, not judged.

Two ways to reach llama.cpp, both optional (a dev/test extra, never a runtime dependency; docs/bench.md
says how to build them):
- `--peer llama-cpp`: the `llama_cpp` module (llama-cpp-python) in this process, on the GGUF
  (`--peer-gguf`, default: the target's source GGUF in the model cache), with the bench's thread count.
- `--peer http://HOST:PORT`: a running llama-server (started on the same GGUF with the same threads);
  its /completion endpoint takes token ids and returns the tokens and its own timings.

- `--peer edgespec:BUNDLE`: another bundle's target alone, in this process (the exact form beside a
  tuned one, `edgespec tune`): the same request, greedy, the same end tokens; its tokenizer must give
  the same ids.

`--peer` may be given more than once, each as `[NAME=]SPEC`: llama.cpp's target alone and its best
speculative mode (a second llama-server started with `--spec-type ngram-mod`, say) beside every mode of
edgespec's, on the same prompts in the same minutes.
"""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol, Sequence

from ..errors import InvalidRequest

HTTP_TIMEOUT_S = 600  # one generation of up to a few hundred tokens on a slow board, plus its prompt


@dataclass
class PeerResult:
    tokens: list[int]  # the new tokens, end token included if it stopped on one
    ttft_s: float  # prompt in -> first new token
    decode_s: float  # first new token -> last


class Peer(Protocol):
    name: str

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int, stop_ids: set[int],
                 request: dict | None = None) -> PeerResult: ...  # request: the prompt as the engine took it


@dataclass
class PeerSample:
    prompt_id: str
    category: str
    repeat: int
    new_tokens: int
    ttft_s: float
    decode_s: float
    first_diff: int | None  # first index where its tokens differ from the target's (None: same)
    compared: bool  # greedy and the target ran this prompt: first_diff means something

    @property
    def decode_tps(self) -> float:
        return max(self.new_tokens - 1, 0) / self.decode_s if self.decode_s > 0 else 0.0


class LlamaServerPeer:
    """llama-server's /completion: the prompt as token ids, greedy (top_k 1), no prompt cache (each
    generation prefills its whole prompt, as the bench's engine does), its timings."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")
        self.name = f"llama-server {self.url}"

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int, stop_ids: set[int],
                 request: dict | None = None) -> PeerResult:
        body = {"prompt": [int(t) for t in prompt_ids], "n_predict": int(max_new_tokens), "temperature": 0.0,
                "top_k": 1, "cache_prompt": False, "return_tokens": True, "stream": False}
        req = urllib.request.Request(self.url + "/completion", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT_S) as r:
                d = json.loads(r.read().decode("utf-8"))
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise InvalidRequest(f"--peer {self.url}: llama-server did not answer /completion ({e})",
                                 param="peer") from None
        tokens = d.get("tokens")
        t = d.get("timings") or {}
        if not isinstance(tokens, list) or "predicted_ms" not in t or "prompt_ms" not in t:
            raise InvalidRequest(f"--peer {self.url}: the answer has no tokens or timings (a llama-server too old "
                                 "for return_tokens?)", param="peer")
        tokens = [int(x) for x in tokens]
        cut = next((i + 1 for i, x in enumerate(tokens) if x in stop_ids), len(tokens))
        # llama-server times the prompt (ending with the first token's logits) and the generation apart
        return PeerResult(tokens[:cut], float(t["prompt_ms"]) / 1e3, float(t["predicted_ms"]) / 1e3)


class LlamaCppPeer:
    """llama-cpp-python in this process: the GGUF loaded once, a fresh context state per generation."""

    def __init__(self, gguf: Path, threads: int, n_ctx: int):
        try:
            import llama_cpp
        except ImportError:
            raise InvalidRequest("--peer llama-cpp: the llama_cpp module is not installed (docs/bench.md, "
                                 "'A peer')", param="peer") from None
        self.name = f"llama.cpp {getattr(llama_cpp, '__version__', '?')} ({Path(gguf).name}, {threads} threads)"
        self.llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=int(n_ctx), n_threads=int(threads),
                                   n_threads_batch=int(threads), verbose=False)

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int, stop_ids: set[int],
                 request: dict | None = None) -> PeerResult:
        self.llm.reset()
        out: list[int] = []
        t0 = time.perf_counter()
        t1 = t0
        for tok in self.llm.generate(list(prompt_ids), top_k=1, temp=0.0, reset=True):
            if not out:
                t1 = time.perf_counter()
            out.append(int(tok))
            if tok in stop_ids or len(out) >= max_new_tokens:
                break
        return PeerResult(out, t1 - t0, time.perf_counter() - t1)


class EdgespecPeer:
    """Another bundle's target alone in this process: the exact form beside a tuned one (or any two
    forms of one model). It takes the request itself and refuses one its tokenizer reads as other ids
    (another model: its tokens could not be compared)."""

    def __init__(self, bundle: str, threads: int, n_ctx: int):
        from ..engine import Engine

        self.name = f"edgespec {Path(bundle).name}, target alone"
        self.engine = Engine.open(bundle, draft="none", threads=threads, max_len=n_ctx)

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int, stop_ids: set[int],
                 request: dict | None = None) -> PeerResult:
        if request is None or self.engine.encode(**request) != list(prompt_ids):
            raise InvalidRequest(f"--peer {self.name}: its tokenizer reads the prompt as other ids than the bench's "
                                 "bundle: compare forms of one model", param="peer")
        r = self.engine.generate(**request, max_new_tokens=max_new_tokens, temperature=0.0, draft="none")
        st = r.stats
        # its own end tokens stop it (one model's are the bench's); its tokens are counted as the bench's target's
        return PeerResult(list(r.token_ids), st.ttft_s, max(0.0, st.total_s - st.ttft_s))

    def close(self) -> None:
        self.engine.close()


def split_label(spec: str) -> tuple[str | None, str]:
    """`NAME=SPEC` -> (NAME, SPEC); a bare SPEC -> (None, SPEC). A URL's own `=` (a query string) is not a
    label: the name is what comes before the first `=`, and only when it holds no `:` or `/`."""
    name, sep, rest = spec.partition("=")
    if not sep or ":" in name or "/" in name:
        return None, spec
    if not name.strip() or not rest:
        raise InvalidRequest(f"--peer {spec!r}: give NAME=llama-cpp or NAME=http://HOST:PORT (a name and a peer)",
                             param="peer")
    return name.strip(), rest


def open_peers(specs: Sequence[str], *, gguf: str | None, source: str, threads: int, n_ctx: int) -> list[PeerRun]:
    """Every `--peer [NAME=]SPEC`, opened, each under its own name (the peer's own when none is given); two
    peers under one name are refused (their lines could not be told apart)."""
    runs: list[PeerRun] = []
    for spec in specs:
        label, rest = split_label(spec)
        run = PeerRun(open_peer(rest, gguf=gguf, source=source, threads=threads, n_ctx=n_ctx), label)
        if any(r.label == run.label for r in runs):
            raise InvalidRequest(f"--peer: two peers are named {run.label!r}: name them apart (NAME=SPEC)",
                                 param="peer")
        runs.append(run)
    return runs


def open_peer(spec: str, *, gguf: str | None, source: str, threads: int, n_ctx: int) -> Peer:
    """`--peer llama-cpp`, `--peer http://HOST:PORT` or `--peer edgespec:BUNDLE` -> a Peer; a clear error for
    anything else."""
    if spec.startswith(("http://", "https://")):
        return LlamaServerPeer(spec)
    if spec.startswith("edgespec:"):
        return EdgespecPeer(spec[len("edgespec:"):], threads, n_ctx)
    if spec != "llama-cpp":
        raise InvalidRequest(f"--peer: {spec!r} is neither llama-cpp, an http:// URL of a llama-server nor "
                             "edgespec:BUNDLE", param="peer")
    path = Path(gguf) if gguf else _cached_gguf(source)
    if path is None or not path.is_file():
        raise InvalidRequest(f"--peer llama-cpp: no GGUF for the target (source {source!r}{f', --peer-gguf {gguf}' if gguf else ''}"
                             "): give the file with --peer-gguf", param="peer_gguf")
    return LlamaCppPeer(path, threads, n_ctx)


def _cached_gguf(source: str) -> Path | None:
    """The target's source GGUF: the source itself when it is a file, else that name in the model cache."""
    if not source.endswith(".gguf"):
        return None
    p = Path(source)
    if p.is_file():
        return p
    from ..models.files import models_dir

    cand = models_dir() / p.name
    return cand if cand.is_file() else None


class PeerRun:
    """A peer and the generations it ran in one bench (bench/run.py calls `run` after each prompt's modes)."""

    def __init__(self, peer: Peer, label: str | None = None):
        self.peer = peer
        self.label = label or peer.name  # what the report calls it
        self.samples: list[PeerSample] = []

    def run(self, engine, p, rep: int, max_new_tokens: int, target_ids: Sequence[int] | None) -> PeerSample:
        """One generation of prompt `p` through the peer, on the ids edgespec's target got."""
        request = p.request()
        ids = engine.encode(**request)
        r = self.peer.generate(ids, p.max_new_tokens or max_new_tokens, set(getattr(engine, "eos_ids", ()) or ()),
                               request)
        diff = None
        if target_ids is not None:
            diff = next((i for i, (a, b) in enumerate(zip(r.tokens, target_ids)) if a != b), None)
            if diff is None and len(r.tokens) != len(target_ids):
                diff = min(len(r.tokens), len(target_ids))
        s = PeerSample(p.id, p.category, rep, len(r.tokens), r.ttft_s, r.decode_s, diff, target_ids is not None)
        self.samples.append(s)
        return s

    def close(self) -> None:
        """Frees what the peer holds in this process (an edgespec peer's engine); a server is left running."""
        close = getattr(self.peer, "close", None)
        if close is not None:
            close()

    def meta(self) -> dict[str, Any]:
        return {"name": self.peer.name, "label": self.label, "samples": [asdict(s) for s in self.samples]}


def format_peer(meta: dict[str, Any], rows: Sequence) -> str:
    """The peer's decode tok/s per category beside each mode's (report.summarize rows)."""
    samples = [PeerSample(**s) for s in meta["samples"]]
    groups = list(dict.fromkeys([s.category for s in samples])) + ["all"]
    label = meta.get("label") or meta["name"]
    named = f"{label} ({meta['name']})" if label != meta["name"] else label
    lines = [f"peer: {named}, the same prompts as token ids, greedy, in this run (bench/peer.py):"]
    for g in groups:
        ss = [s for s in samples if g == "all" or s.category == g]
        tok = sum(max(s.new_tokens - 1, 0) for s in ss)
        sec = sum(s.decode_s for s in ss)
        if not ss or sec <= 0:
            continue
        tps = tok / sec
        modes = " ".join(f"{r.mode} {r.tokens_per_s:.1f} ({r.tokens_per_s / tps:.2f}x)" for r in rows
                         if r.group == g)
        compared = [s for s in ss if s.compared]
        same = sum(1 for s in compared if s.first_diff is None)
        lines.append(f"  {g}: peer {tps:.1f} tok/s; edgespec {modes}; peer's tokens = target's in {same} of "
                     f"{len(compared)}")
    return "\n".join(lines)
