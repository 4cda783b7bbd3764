"""The GPU check at a real model's shape (scripts/gpu-check.sh --shape-check): what a step of the 1.5B target
and of the 0.5B draft costs on a provider, measured on a bundle of their exact shapes built from random
weights on the device (no weights travel), and what each drafting mode would gain there.

- `SHAPES`: the hyperparameters and GGUF block types of the default pair (Qwen2.5-Coder-1.5B-Instruct Q4_K_M and
  0.5B-Instruct Q4_K_M, read from the GGUF files `edgespec pull` fetches), in the keywords the export half's
  tiny-GGUF writer takes (edgespec_export.native.tiny_gguf.make_gguf); `SMALL`: a stand-in that builds in
  seconds, for a run on the CPU provider.
- `measure`: per model, the seconds of a step of n = 1..16 tokens at a fixed cache length, and at a few of those
  sizes (SPOT: what fits a short lease) the other ways:
  edgespec's runner (I/O binding: the cache stays where the provider keeps it), a plain `session.run` with numpy
  feeds (the whole cache copied in and out every step), and, on CUDA, the same fixed-shape step replayed as a
  CUDA graph (onnxruntime's `enable_cuda_graph`); and batches of 1..4 rows of n tokens (the batched runner).
  Times are medians over repeats after a warm-up.
- `slope`: the verify slope, seconds per extra token of a step (least squares over n = 1..16).
- `project`: each drafting mode's speed-up on those costs, from a bench run of the real pair on the CPU (its
  per-mode step histograms: how many target steps of how many tokens, how many draft steps): the run replayed
  with this provider's step costs. Labelled projected: acceptance is the CPU run's, the costs this run's, and
  a drafter's own CPU time (suffix, n-gram lookups) is left out.
"""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

# make_gguf keywords; types per tensor kind as llama.cpp's Q4_K_M files hold them (the draft's 896 columns are
# not a multiple of 256, so most of its matrices are Q5_0 there)
SHAPES: dict[str, dict[str, Any]] = {
    "target": {"arch": "qwen2", "hidden": 1536, "heads": 12, "kv_heads": 2, "ffn": 8960, "layers": 28,
               "vocab": 151936, "context": 32768,
               "types": {"embed": "Q4_K", "q": "Q4_K", "k": "Q4_K", "v": "Q6_K", "o": "Q4_K", "gate": "Q4_K",
                         "up": "Q4_K", "down": "Q6_K", "head": "Q6_K"}},
    "draft": {"arch": "qwen2", "hidden": 896, "heads": 14, "kv_heads": 2, "ffn": 4864, "layers": 24,
              "vocab": 151936, "context": 32768,
              "types": {"embed": "Q5_0", "q": "Q5_0", "k": "Q5_0", "v": "Q8_0", "o": "Q5_0", "gate": "Q5_0",
                        "up": "Q5_0", "down": "Q4_K", "head": "Q8_0"}},
}
# (a vocabulary of 1280 rows: the bundle check tells the lm_head by its rows, so no other matrix may have as many,
# and the export fuses gate and up into one of 2 x ffn rows)
SMALL: dict[str, dict[str, Any]] = {
    "target": {"arch": "qwen2", "hidden": 256, "heads": 4, "kv_heads": 2, "ffn": 768, "layers": 4, "vocab": 1280,
               "context": 2048, "types": dict(SHAPES["target"]["types"])},
    "draft": {"arch": "qwen2", "hidden": 256, "heads": 4, "kv_heads": 2, "ffn": 512, "layers": 2, "vocab": 1280,
              "context": 2048, "types": {k: "Q8_0" for k in SHAPES["target"]["types"]}},
}
SIZES = tuple(range(1, 17))  # tokens per step: a decode step (1) to a verify of 15 drafted tokens (16)
BATCHES = (1, 2, 3, 4)
SPOT = (1, 2, 4, 8, 16)  # the sizes the slower comparisons (no I/O binding, batches, CUDA graphs) are timed at


def shape(role: str, small: bool = False) -> dict[str, Any]:
    """The make_gguf keywords of the target or the draft (or their small stand-ins)."""
    table = SMALL if small else SHAPES
    if role not in table:
        raise ValueError(f"unknown role {role!r}: target or draft")
    return dict(table[role])


def _median_time(fn, repeats: int) -> float:
    fn()  # warm-up: allocations, kernel choice, a CUDA graph's capture
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def slope(costs: dict[int, float]) -> dict[str, float]:
    """Least squares over the step sizes: seconds per extra token, the fitted cost of one token, and t(16)/t(1)."""
    n = np.array(sorted(costs), dtype=np.float64)
    t = np.array([costs[int(k)] for k in n], dtype=np.float64)
    a, b = np.polyfit(n, t, 1)
    return {"s_per_token": float(a), "intercept_s": float(b),
            "ratio_last_first": float(t[-1] / t[0]) if t[0] > 0 else float("nan")}


def _tokens(n: int, vocab: int, rng) -> list[int]:
    return [int(x) for x in rng.integers(1, min(vocab, 1000), size=n)]


def _runner_costs(runner, sizes, past: int, repeats: int, vocab: int, rng) -> dict[int, float]:
    """edgespec's own step (I/O binding), at a cache of `past` tokens, rewound after every step."""
    runner.reset()
    runner.step(_tokens(past, vocab, rng))

    def one(n: int):
        toks = _tokens(n, vocab, rng)

        def run():
            runner.step(toks, n_logits=n)
            runner.rewind(past)
        return run

    return {n: _median_time(one(n), repeats) for n in sizes}


def _plain_costs(session, facts, sizes, past: int, max_len: int, repeats: int, rng) -> dict[int, float]:
    """The same steps through `session.run` with numpy feeds: every step copies the whole cache in and out
    (what I/O binding saves)."""
    from ..core.dtypes import NP_DTYPES
    from ..core.runner import contract_inputs

    names = {i.name for i in session.get_inputs()}
    positions, bias = contract_inputs(facts, names)
    kv_dtype = NP_DTYPES[facts.kv_dtype]
    kv = np.zeros((1, facts.kv_heads, max_len, facts.head_dim), dtype=kv_dtype)
    out: dict[int, float] = {}
    for n in sizes:
        feeds: dict[str, Any] = {facts.input_ids: np.array([_tokens(n, facts.vocab_size, rng)], dtype=np.int64),
                                 facts.attention_mask: np.ones((1, past + n), dtype=np.int64)}
        if positions:
            feeds[facts.position_ids] = np.arange(past, past + n, dtype=np.int64).reshape(1, n)
        if bias:
            feeds[facts.attention_bias] = np.zeros((1, 1, n, past + n), dtype=kv_dtype)
        if facts.logits_to_keep is not None and facts.logits_to_keep in names:
            feeds[facts.logits_to_keep] = np.array([n], dtype=np.int64)
        for i in range(facts.layers):
            feeds[facts.past_key % i] = kv
            feeds[facts.past_value % i] = kv
        out[n] = _median_time(lambda f=feeds: session.run([facts.logits], f), repeats)
    return out


def _batch_costs(batch, batches, sizes, past: int, repeats: int, vocab: int, rng) -> dict[str, dict[int, float]]:
    """b rows of n tokens each in one batched step (the batched runner: server --parallel)."""
    out: dict[str, dict[int, float]] = {}
    for b in batches:
        for slot in range(b):
            batch.reset(slot)
            batch.step({slot: _tokens(past, vocab, rng)})
        row: dict[int, float] = {}
        for n in sizes:
            rows = {slot: _tokens(n, vocab, rng) for slot in range(b)}

            def run(rows=rows):
                batch.step(rows)
                for slot in rows:
                    batch.rewind(slot, past)
            row[n] = _median_time(run, repeats)
        out[str(b)] = row
    return out


def _cuda_graph_costs(path: Path, facts, sizes, past: int, max_len: int, repeats: int, rng) -> dict[int, float]:
    """A fixed-shape step replayed as a CUDA graph: every input and output bound on the device once, the graph
    captured on the first run, replayed after (onnxruntime's enable_cuda_graph; a shape needs its own graph, so
    one session per size). Raises what onnxruntime raises where a graph cannot be captured."""
    import onnxruntime as ort

    from ..core.dtypes import NP_DTYPES
    from ..core.runner import contract_inputs
    from ..edge.providers import session_options

    kv_dtype = NP_DTYPES[facts.kv_dtype]
    out: dict[int, float] = {}
    for n in sizes:
        sess = ort.InferenceSession(str(path), session_options(), providers=[
            ("CUDAExecutionProvider", {"enable_cuda_graph": "1"})])
        names = {i.name for i in sess.get_inputs()}
        positions, bias = contract_inputs(facts, names)
        binding = sess.io_binding()

        def dev(arr):
            return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(arr), "cuda", 0)

        keep = [dev(np.array([_tokens(n, facts.vocab_size, rng)], dtype=np.int64)),
                dev(np.ones((1, past + n), dtype=np.int64))]
        binding.bind_ortvalue_input(facts.input_ids, keep[0])
        binding.bind_ortvalue_input(facts.attention_mask, keep[1])
        if positions:
            keep.append(dev(np.arange(past, past + n, dtype=np.int64).reshape(1, n)))
            binding.bind_ortvalue_input(facts.position_ids, keep[-1])
        if bias:
            keep.append(dev(np.zeros((1, 1, n, past + n), dtype=kv_dtype)))
            binding.bind_ortvalue_input(facts.attention_bias, keep[-1])
        if facts.logits_to_keep is not None and facts.logits_to_keep in names:
            keep.append(dev(np.array([n], dtype=np.int64)))
            binding.bind_ortvalue_input(facts.logits_to_keep, keep[-1])
        for i in range(facts.layers):
            for fmt_in, fmt_out in ((facts.past_key, facts.present_key), (facts.past_value, facts.present_value)):
                kv = ort.OrtValue.ortvalue_from_shape_and_type([1, facts.kv_heads, max_len, facts.head_dim],
                                                               kv_dtype, "cuda", 0)
                keep.append(kv)
                binding.bind_ortvalue_input(fmt_in % i, kv)
                binding.bind_ortvalue_output(fmt_out % i, kv)
        logits_rows = n
        keep.append(ort.OrtValue.ortvalue_from_shape_and_type([1, logits_rows, facts.vocab_size],
                                                              NP_DTYPES[facts.logits_dtype], "cuda", 0))
        binding.bind_ortvalue_output(facts.logits, keep[-1])
        sess.run_with_iobinding(binding)  # the capture
        out[n] = _median_time(lambda s=sess, b=binding: s.run_with_iobinding(b), repeats)
    return out


def measure(bundle_path: str | Path, *, provider: str = "cuda", past: int = 128, repeats: int = 5,
            sizes=SIZES, batches=BATCHES, seed: int = 0) -> dict[str, Any]:
    """Step costs of the bundle's target and draft on `provider` ("cuda" or "cpu"), as plain data."""
    import onnxruntime as ort

    from ..edge import providers as prov
    from ..engine.build import load_model, load_runner
    from ..models.bundle import Bundle, resolve_bundle

    b = Bundle.open(resolve_bundle(bundle_path), verify=False)
    order = ["cuda", "cpu"] if provider == "cuda" else ["cpu"]
    max_len = past + max(sizes) + 2
    rng = np.random.default_rng(seed)
    report: dict[str, Any] = {"provider": provider, "onnxruntime": ort.__version__, "past": past, "repeats": repeats,
                              "sizes": list(sizes), "batches": list(batches), "models": {}}
    for role in ("target", "draft"):
        facts = b.target if role == "target" else b.draft
        if facts is None:
            continue
        path = b.model_path(role)
        runner = load_runner(path, facts, max_len, providers=order, force_flavor=True)
        placed = prov.short_name(runner.session.get_providers()[0])
        row: dict[str, Any] = {"placed_on": placed, "layers": facts.layers, "vocab": facts.vocab_size,
                               "weights_bytes": sum(f.stat().st_size for f in path.parent.glob(path.name + "*"))}
        row["io_binding"] = _runner_costs(runner, sizes, past, repeats, facts.vocab_size, rng)
        row["verify_slope"] = slope(row["io_binding"])
        spot = tuple(n for n in SPOT if n in sizes)
        row["plain_run"] = _plain_costs(runner.session, runner.facts, spot, past, runner.max_len_rows, repeats, rng)
        del runner
        batch = load_model(path, facts, max_len, slots=max(batches), providers=order, shared_threads=True,
                           force_flavor=True)
        row["batched"] = _batch_costs(batch, batches, spot, past, repeats, facts.vocab_size, rng)
        row["batched_one_pass"] = bool(batch.one_pass)
        del batch
        if provider == "cuda" and placed == "cuda":
            try:
                row["cuda_graph"] = _cuda_graph_costs(path, facts, (1, 4, 16), past, max_len, repeats, rng)
            except Exception as e:  # noqa: BLE001  (what onnxruntime says is the finding)
                row["cuda_graph_error"] = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
        else:
            row["cuda_graph_error"] = f"not offered by the {placed} provider (onnxruntime's CUDA provider only)"
        report["models"][role] = row
    return report


def _cost(costs: dict[int, float], n: int) -> float:
    """A step of n tokens: measured, or past the largest size measured, extrapolated along the fitted slope."""
    if n in costs:
        return costs[n]
    top = max(costs)
    return costs[top] + max(slope(costs)["s_per_token"], 0.0) * (n - top)


def project(steps: dict[str, Any], bench: dict[str, Any]) -> list[dict[str, Any]]:
    """Each mode of a bench run (`edgespec bench --json` of the real pair) replayed with these step costs:
    the seconds its target steps and draft-model steps would take here, against the target alone's."""
    target = {int(k): v for k, v in steps["models"]["target"]["io_binding"].items()}
    draft_row = steps["models"].get("draft")
    draft = {int(k): v for k, v in draft_row["io_binding"].items()} if draft_row else None
    per_mode: dict[str, dict[str, float]] = {}
    for r in bench["samples"]:
        m = per_mode.setdefault(r["mode"], {"tokens": 0, "seconds": 0.0, "target_steps": 0, "draft_steps": 0})
        m["tokens"] += r["new_tokens"]
        for n, (count, _s) in (r.get("target_steps") or {}).items():
            m["seconds"] += count * _cost(target, int(n))
            m["target_steps"] += count
        for n, (count, _s) in (r.get("draft_steps") or {}).items():
            if draft is not None:
                m["seconds"] += count * _cost(draft, int(n))
            m["draft_steps"] += count
    base = per_mode.get("target")
    out = []
    for mode, m in per_mode.items():
        tps = m["tokens"] / m["seconds"] if m["seconds"] else float("nan")
        row = {"mode": mode, "tokens": m["tokens"], "target_steps": m["target_steps"], "draft_steps": m["draft_steps"],
               "projected_tok_s": tps}
        if base and base["seconds"] and mode != "target":
            row["projected_speedup"] = tps / (base["tokens"] / base["seconds"])
        out.append(row)
    return out


def render(steps: dict[str, Any], projection: list[dict[str, Any]] | None = None, *, label: str = "") -> list[str]:
    """The findings as lines: per model the step costs, the slope, batching, I/O binding and CUDA graphs; then the
    projected speed-ups."""
    ms = lambda s: f"{s * 1000:.2f}"  # noqa: E731
    lines = [f"step costs on {steps['provider']} (onnxruntime {steps['onnxruntime']}, cache {steps['past']} tokens, "
             f"median of {steps['repeats']}){label}"]
    for role, r in steps["models"].items():
        io = {int(k): v for k, v in r["io_binding"].items()}
        sl = r["verify_slope"]
        lines.append(f"- {role} ({r['layers']} layers, {r['weights_bytes'] / (1 << 20):.0f} MiB of weights, on "
                     f"{r['placed_on']}): ms per step of n tokens: "
                     + ", ".join(f"{n}: {ms(io[n])}" for n in sorted(io)))
        lines.append(f"  verify slope {sl['s_per_token'] * 1000:.3f} ms per extra token; t(16)/t(1) = "
                     f"{sl['ratio_last_first']:.2f}; {r['weights_bytes'] / io[1] / 1e9:.1f} GB/s of weights read "
                     "by a one-token step")
        plain = {int(k): v for k, v in r["plain_run"].items()}
        lines.append("  without I/O binding (cache copied every step): "
                     + ", ".join(f"{n}: {ms(plain[n])} ({plain[n] / io[n]:.2f}x)" for n in (1, 4, 16) if n in plain))
        for bsz, row in r["batched"].items():
            row = {int(k): v for k, v in row.items()}
            lines.append(f"  batch {bsz}: " + ", ".join(f"{n}: {ms(row[n])}" for n in (1, 2, 4, 8, 16) if n in row)
                         + ("" if r["batched_one_pass"] or bsz == "1" else " (a pass per row)"))
        if r.get("cuda_graph"):
            g = {int(k): v for k, v in r["cuda_graph"].items()}
            lines.append("  CUDA graph replay (fixed shape): " + ", ".join(
                f"{n}: {ms(g[n])} ({g[n] / io[n]:.2f}x of the runner's)" for n in sorted(g)))
        else:
            lines.append(f"  CUDA graph: {r.get('cuda_graph_error')}")
    if projection:
        lines.append("projected (acceptance from the real pair's bench run on the CPU, these step costs; drafting's own "
                     "CPU time left out):")
        for p in projection:
            sp = f", {p['projected_speedup']:.2f}x the target alone" if "projected_speedup" in p else ""
            lines.append(f"- {p['mode']}: {p['projected_tok_s']:.1f} tok/s projected{sp} ({p['target_steps']} target "
                         f"steps, {p['draft_steps']} draft steps for {p['tokens']} tokens)")
    return lines


def write_json(path: str | Path, data: Any) -> None:
    Path(path).write_text(json.dumps(data, indent=1, default=float))
