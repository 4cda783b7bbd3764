"""`edgespec bench`: every drafting mode on the same prompts, in one process, interleaved.

Speed-ups are only trustworthy as ratios measured side by side: the machine's speed drifts (other
jobs, clocks, heat), so each prompt runs every mode back to back (A B C A B C ...), the order
rotating from repeat to repeat, and the speed-up of a mode is its throughput divided by the target
alone's *in the same run*. Nothing here asserts a speed; it measures and reports.

Per generation it records the engine's GenerationStats, whether the tokens equal the target-alone
tokens for the same prompt (the lossless property, checked on real prompts), the process's peak
RSS during that generation, and the steps each model ran by number of tokens (from the runners'
StepTimes): the raw material for "where the time goes" and for the projection to other boards.

Prompt files are JSON Lines, one prompt per line (see docs/bench.md):
    {"id": "code-write-1", "category": "write", "prompt": "Write a Python function ..."}
    {"id": "sys-1", "category": "answer", "messages": [{"role": "system", ...}, {"role": "user", ...}]}
    optional: "max_new_tokens": int, "raw": true (send "prompt" as plain text, without the chat template),
              "conversation": str (turns with the same conversation run in file order, each one's
              request holding the earlier turns and the answers this mode gave them; the engine is
              not reset between turns, so later turns can draw on what earlier ones left in it)
"""
from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from ..drafters import modes as drafting
from ..errors import DraftUnavailable, InvalidRequest
from ..limits import K_LIMIT
from ..units import peak_rss_bytes
from .lineage import Lineages
from .prompts import Prompt, prompt_units

MODES = ("target", *(m.name for m in drafting.MODES if m.name != "none"))  # drafters/modes.py; "none" is "target"
FIXED_K_MODES = tuple(m.name for m in drafting.MODES if m.fixed_k)  # --k adds "mode k=N" columns for these
# a speculative mode with a tree suffix runs with tree verification: "auto+tree" (tree="on": always
# a tree) or "auto+tree-auto" (tree="auto": a tree when the cost model says it pays); plain modes
# run chains (tree="off"), so their numbers stay comparable with runs from before trees
TREE_SUFFIX = {"on": "+tree", "auto": "+tree-auto"}


def split_tree(name: str) -> tuple[str, str]:
    """'auto+tree' -> ('auto', 'on'); 'auto+tree-auto' -> ('auto', 'auto'); 'auto' -> ('auto', 'off')."""
    for tree, suffix in sorted(TREE_SUFFIX.items(), key=lambda kv: -len(kv[1])):
        if name.endswith(suffix):
            return name[: -len(suffix)], tree
    return name, "off"

# decode steps hold at most K_LIMIT + 1 tokens; anything longer is a prompt being prefilled
PREFILL_MIN_TOKENS = K_LIMIT + 2


# --- modes ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Mode:
    """One column of the comparison: a drafting mode, adaptive (k=None) or with a fixed k."""

    draft: str  # a drafting mode's name (drafters/modes.py); "none" is the target alone
    k: int | None = None
    tree: str = "off"  # "off" (chains, as before trees existed) | "on" ("+tree") | "auto" ("+tree-auto")

    @property
    def label(self) -> str:
        base = "target" if self.draft == "none" else self.draft
        base += TREE_SUFFIX.get(self.tree, "")
        return base if self.k is None else f"{base} k={self.k}"

    @property
    def speculative(self) -> bool:
        return self.draft != "none"


def parse_modes(modes: str, ks: str | None, *, has_draft: bool, has_heads: bool = True) -> list[Mode]:
    """'target,model,ngram,auto' and '2,4,8' -> modes; the target alone always comes first (every
    speed-up is relative to it). Fixed-k variants are added for the FIXED_K_MODES."""
    names = [m.strip() for m in modes.split(",") if m.strip()]
    bad = [m for m in names if split_tree(m)[0] not in MODES or (split_tree(m)[1] != "off" and split_tree(m)[0] == "target")]
    if bad or not names:
        raise InvalidRequest(f"--modes: unknown mode(s) {bad or modes!r}; choose from {', '.join(MODES)} (a "
                             "speculative one may end in +tree or +tree-auto)", param="modes")
    bases = [split_tree(n)[0] for n in names]
    if "model" in bases and not has_draft:
        raise DraftUnavailable("--modes model: the bundle has no draft model (use target,ngram,self,auto)",
                               param="modes")
    if "heads" in bases and not has_heads:
        raise DraftUnavailable("--modes heads: the bundle has no draft heads (export it with --heads feature or --heads medusa)",
                               param="modes")
    with_runner = [b for b in dict.fromkeys(bases) if b != "target" and drafting.get(b).runner]
    if "self" in with_runner and len(with_runner) > 1:  # the self-draft's engine loads nothing else
        raise InvalidRequest(f"--modes: {' and '.join(with_runner)} need differently opened engines (the self-draft "
                             "shares unpacked weights with the target, docs/runtime.md): run them in two benches",
                             param="modes")
    k_list: list[int] = []
    if ks:
        for x in (y.strip() for y in ks.split(",") if y.strip()):
            if not x.isdigit() or not 1 <= int(x) <= K_LIMIT:
                raise InvalidRequest(f"--k: {x!r} is not an integer from 1 to {K_LIMIT}", param="k")
            if int(x) not in k_list:
                k_list.append(int(x))
    out = [Mode("none")]
    for name in names:
        if name == "target":
            continue
        base, tree = split_tree(name)
        out.append(Mode(base, None, tree))
        if base in FIXED_K_MODES:
            out += [Mode(base, k, tree) for k in k_list]
    if len(out) == 1:
        raise InvalidRequest("--modes: nothing to compare with the target alone (add auto, suffix, recycle, "
                             "ngram or model)", param="modes")
    return out


# --- measuring ------------------------------------------------------------------------------------
class PeakRSS:
    """The process's peak resident memory over an interval. On Linux the kernel's high-water mark
    is reset by writing 5 to /proc/self/clear_refs, so each generation gets its own peak; where that
    is not possible the figure is the peak since the process started (and says so)."""

    def __init__(self):
        self.resettable = self._reset()

    @staticmethod
    def _reset() -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return True
        except OSError:
            return False

    def start(self) -> None:
        if self.resettable:
            self._reset()

    def peak_mb(self) -> float:
        return peak_rss_bytes() / (1 << 20)


def _times_snapshot(runner) -> dict[int, tuple[int, float]]:
    if runner is None or not hasattr(runner, "times"):
        return {}
    t = runner.times
    return {n: (t.count.get(n, 0), t.total_s.get(n, 0.0)) for n in t.count}


def _times_delta(before: dict, after: dict) -> dict[int, list]:
    """Steps run between two snapshots: {tokens per step: [count, seconds]}."""
    out = {}
    for n, (c, s) in after.items():
        c0, s0 = before.get(n, (0, 0.0))
        if c - c0:
            out[n] = [c - c0, s - s0]
    return out


@dataclass
class Sample:
    """One generation: one prompt, one mode, one repeat."""

    prompt_id: str
    category: str
    mode: str
    repeat: int
    new_tokens: int
    prompt_tokens: int
    ttft_s: float
    decode_s: float  # first token chosen -> end
    decode_tps: float
    total_s: float
    target_passes: int
    drafted: int
    accepted: int
    acceptance: float | None  # None when nothing was drafted
    tokens_per_pass: float
    k_mean: float
    finish_reason: str
    peak_rss_mb: float
    same_as_target: bool | None  # None for the target itself and when sampling
    first_diff: int | None  # index of the first token that differs from the target's
    rounds_by_source: dict[str, int] = field(default_factory=dict)
    tree_rounds: int = 0  # rounds verified as a tree
    tree_nodes: int = 0  # their nodes, roots included
    tree_off_chain: int = 0  # tree rounds whose accepted path left the drafter's chain
    accepted_depth: dict[int, int] = field(default_factory=dict)  # tree rounds by accepted depth
    accepted_by_source: dict[str, int] = field(default_factory=dict)
    target_steps: dict[int, list] = field(default_factory=dict)  # tokens/step -> [count, seconds]
    draft_steps: dict[int, list] = field(default_factory=dict)
    text: str = ""
    forced_tokens: int = 0  # output tokens the prompt's grammar forced (its json_schema; 0 without one)


@dataclass
class BenchRun:
    meta: dict[str, Any]
    modes: list[Mode]
    prompts: list[Prompt]
    samples: list[Sample]

    def to_dict(self) -> dict[str, Any]:
        return {
            "meta": self.meta,
            "modes": [m.label for m in self.modes],
            "prompts": [asdict(p) for p in self.prompts],
            "samples": [asdict(s) for s in self.samples],
        }


def _first_diff(a: Sequence[int], b: Sequence[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def fresh_cache(engine) -> None:
    """Makes the next request prefill its whole prompt. The engine reuses a shared prefix between
    requests, which would hand every mode after the first a free prefill of the same prompt."""
    engine.reset_cache()  # takes the engine's lock itself


def run_bench(
    engine,
    prompts: Sequence[Prompt],
    modes: Sequence[Mode],
    *,
    max_new_tokens: int = 128,
    repeats: int = 3,
    temperature: float = 0.0,
    seed: int | None = 0,
    warmup: bool = True,
    on_sample: Callable[[Sample, int, int], None] | None = None,
    peers: Sequence = (),  # bench/peer.py PeerRuns: each prompt outside a conversation runs through each too
) -> BenchRun:
    """Runs every mode on every prompt `repeats` times, interleaved, on one open Engine.

    Order: for each repeat, for each prompt, all modes back to back, the mode order rotated by one
    per prompt and per repeat, so no mode always runs first after a prompt change, on any prompt; the drafters' learning is
    kept per mode (lineage.py). A conversation counts
    as one prompt here: each mode runs all its turns in order, from one reset."""
    if repeats < 1:
        raise InvalidRequest(f"--repeats must be at least 1, got {repeats}", param="repeats")
    if max_new_tokens < 1:
        raise InvalidRequest(f"--max-new-tokens must be at least 1, got {max_new_tokens}", param="max_new_tokens")
    modes = list(modes)
    if not modes or modes[0].draft != "none":
        raise InvalidRequest("the first mode must be the target alone", param="modes")
    check_fit(engine, prompts, max_new_tokens)
    greedy = temperature == 0.0
    load_start = _loadavg()
    rss = PeakRSS()
    lineages = Lineages(engine, fresh_cache)  # each mode learns alone, from before the warmup (lineage.py)
    if warmup:
        _warm(engine, prompts[0], modes)
    samples: list[Sample] = []
    total = repeats * len(prompts) * len(modes)
    done = 0
    units = prompt_units(prompts)
    for rep in range(repeats):
        for ui, unit in enumerate(units):
            order = mode_order(modes, rep, ui)
            target_ids: dict[str, list[int]] = {}
            pending: list[tuple[Sample, list[int]]] = []
            for mode in order:
                lineages.enter(mode.label)  # fresh caches once per prompt, or per conversation: its turns follow on
                history: list[dict] = []
                for p in unit:
                    s, ids, text = _one(engine, p, mode, rep, history, rss, max_new_tokens, temperature, seed)
                    if p.conversation is not None:
                        history += [*p.turn(), {"role": "assistant", "content": text}]
                    if mode.draft == "none":
                        target_ids[p.id] = ids
                    pending.append((s, ids))
                lineages.leave(mode.label)
            for peer in peers if unit[0].conversation is None else ():
                peer.run(engine, unit[0], rep, max_new_tokens, target_ids.get(unit[0].id) if greedy else None)
            for s, ids in pending:  # the target may have run after some modes: compare at the end
                ref = target_ids.get(s.prompt_id)
                if s.mode != "target" and greedy and ref is not None:
                    s.first_diff = _first_diff(ids, ref)
                    s.same_as_target = s.first_diff is None
                samples.append(s)
                done += 1
                if on_sample:
                    on_sample(s, done, total)
    meta = run_meta(engine, max_new_tokens=max_new_tokens, repeats=repeats, temperature=temperature, seed=seed)
    meta["rss_per_generation"] = rss.resettable
    meta["loadavg_start"] = load_start
    meta["loadavg_end"] = _loadavg()
    meta["peers"] = [peer.meta() for peer in peers]
    return BenchRun(meta=meta, modes=modes, prompts=list(prompts), samples=samples)


def mode_order(modes: Sequence[Mode], rep: int, unit: int) -> list[Mode]:
    """The modes' order on prompt `unit` in repeat `rep`: rotated by one per prompt and per repeat. By rep + unit,
    not rep * prompts + unit: with as many prompts as modes (or a multiple) that gave each prompt the same order
    in every repeat, so on each prompt one mode always ran first after the prompt changed."""
    shift = (rep + unit) % len(modes)
    return list(modes[shift:]) + list(modes[:shift])


def _draft_runner(engine):
    """The runner whose steps are the draft's: the draft model's, else the self-draft's."""
    return getattr(engine, "draft_runner", None) or getattr(engine, "self_runner", None)


def _one(engine, p: Prompt, mode: Mode, rep: int, history: Sequence[dict], rss: PeakRSS, max_new_tokens: int,
         temperature: float, seed: int | None) -> tuple[Sample, list[int], str]:
    """One generation, measured."""
    t_snap = _times_snapshot(engine.target)
    d_snap = _times_snapshot(_draft_runner(engine))
    rss.start()
    res = engine.generate(**p.generation(history), max_new_tokens=p.max_new_tokens or max_new_tokens,
                          temperature=temperature, seed=seed, draft=mode.draft, k=mode.k, tree=mode.tree)
    peak = rss.peak_mb()
    st = res.stats
    decode_s = max(st.total_s - st.ttft_s, 0.0)
    s = Sample(
        prompt_id=p.id, category=p.category, mode=mode.label, repeat=rep,
        new_tokens=st.new_tokens, prompt_tokens=st.prompt_tokens, ttft_s=st.ttft_s, decode_s=decode_s,
        decode_tps=st.decode_tokens_per_second, total_s=st.total_s, target_passes=st.target_passes,
        drafted=st.drafted, accepted=st.accepted,
        acceptance=(st.accepted / st.drafted) if st.drafted else None,
        tokens_per_pass=st.tokens_per_pass, k_mean=st.k_mean, finish_reason=res.finish_reason,
        peak_rss_mb=round(peak, 1), same_as_target=None, first_diff=None,
        rounds_by_source=dict(getattr(st, "rounds_by_source", {}) or {}),
        accepted_by_source=dict(getattr(st, "accepted_by_source", {}) or {}),
        tree_rounds=getattr(st, "tree_rounds", 0), tree_nodes=getattr(st, "tree_nodes", 0),
        tree_off_chain=getattr(st, "tree_off_chain", 0),
        accepted_depth=dict(getattr(st, "accepted_depth", {}) or {}),
        target_steps=_times_delta(t_snap, _times_snapshot(engine.target)),
        draft_steps=_times_delta(d_snap, _times_snapshot(_draft_runner(engine))),
        text=res.text, forced_tokens=getattr(st, "forced_tokens", 0),
    )
    return s, list(res.token_ids), res.text


def check_fit(engine, prompts: Sequence[Prompt], max_new_tokens: int) -> None:
    """Every prompt must fit the cache with room to generate; all offenders are named at once,
    before anything is measured (rather than failing an hour into a run)."""
    bad = []
    for p in prompts:
        n = engine.count_tokens(**p.request())
        if n + 1 > engine.max_len:
            bad.append(f"{p.id} ({n} tokens)")
    if bad:
        raise InvalidRequest(
            f"{len(bad)} prompt(s) do not fit the cache of {engine.max_len} tokens: {', '.join(bad)}; "
            "use --max-len (if the model allows) or shorter prompts", param="prompts")


def _warm(engine, prompt: Prompt, modes: Sequence[Mode]) -> None:
    """One-off costs (allocations, kernel selection, page faults on the weights) are paid here, not
    by whichever mode happens to run first."""
    if hasattr(engine, "warmup"):
        ks = [m.k for m in modes if m.k]
        engine.warmup(k_max=max([4, *ks]))
    for m in modes:
        fresh_cache(engine)
        engine.generate(**prompt.generation(), max_new_tokens=8, draft=m.draft, k=m.k, tree=m.tree)


def run_meta(engine, **settings) -> dict[str, Any]:
    """What a reader of the JSON needs to judge the numbers: machine, versions, bundle, settings."""
    import numpy

    import onnxruntime as ort

    from .. import __version__

    from .projection import graph_costs as _graph_costs

    b = engine.bundle
    models = {}
    for role, f in b.manifest.models.items():
        models[role] = {"arch": f.arch, "layers": f.layers, "quant": f.quant, "accuracy_level": f.accuracy_level,
                        "params": f.params, "bytes": b.model_bytes(role), "kv_bytes_per_token": f.kv_bytes_per_token(),
                        "source": f.source, "flavor": f.graph_flavor(),
                        "graphs": {fl: {"bytes": nb, "kv_bytes_per_token": kv}
                                   for fl, (nb, kv) in _graph_costs(b, role).items()}}
    need = None
    try:  # the memory planner's estimate, so the projection's "fits" agrees with `edgespec plan`
        from ..edge.memory import predict

        need = int(sum(predict(b, engine.max_len, getattr(engine, "draft_runner", None) is not None).values()))
    except Exception:  # the planner is an estimate for a column; it must never fail a finished run
        need = None
    meta = {
        "edgespec": __version__,
        "onnxruntime": ort.__version__,
        "numpy": numpy.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "bundle": str(b.root),
        "bundle_name": b.name,
        "deterministic": bool(getattr(engine, "deterministic", False)),
        "models": models,
        "max_len": engine.max_len,
        "draft_loaded": getattr(engine, "draft_runner", None) is not None,
        "memory_need_bytes": need,
        **settings,
    }
    return meta


def load_run(path: str | os.PathLike) -> BenchRun:
    """A run saved with --json, for reporting, plotting or projecting again without re-measuring."""
    p = Path(path)
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
        modes = []
        for label in d["modes"]:
            base, _, k = label.partition(" k=")
            base, tree = split_tree(base)
            modes.append(Mode("none" if base == "target" else base, int(k) if k else None, tree))
        samples = []
        for s in d["samples"]:
            s = dict(s)
            for key in ("target_steps", "draft_steps", "accepted_depth"):
                s[key] = {int(n): v for n, v in s.get(key, {}).items()}
            samples.append(Sample(**s))
        return BenchRun(meta=d["meta"], modes=modes, prompts=[Prompt(**x) for x in d["prompts"]], samples=samples)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise InvalidRequest(f"{p}: not a bench JSON written by `edgespec bench --json` ({type(e).__name__}: {e})",
                             param="bundle") from None


def _cpu_name() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None
