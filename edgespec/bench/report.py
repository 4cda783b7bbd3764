"""Turning a bench run's samples into the numbers people read: per category and per prompt, each
mode's throughput, its speed-up over the target alone *within the same run*, time to first token,
acceptance, tokens per target pass, peak RSS and how many outputs equal the target's; where the
decode time goes; and (separately, labelled) the projection to boards.

Throughput is pooled: sum of decode tokens / sum of decode time over the group's generations, so a
long generation weighs more than a short one, as it does for a user waiting on it. The speed-up's
range is the spread of the same ratio computed repeat by repeat (each repeat is a full interleaved
pass over the prompts): a wide range means the machine was noisy.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from .modework import forced_lines
from .run import PREFILL_MIN_TOKENS, BenchRun, Sample

ALL = "all"


@dataclass
class Row:
    group: str  # a category, a prompt id, or "all"
    mode: str
    generations: int
    tokens: int  # decode tokens (after each generation's first)
    tokens_per_s: float
    speedup: float | None  # vs the target alone in the same group and run
    speedup_range: tuple[float, float] | None  # min, max of the per-repeat ratio
    ttft_ms: float  # median
    acceptance: float | None
    tokens_per_pass: float
    k_mean: float | None
    same: int  # outputs equal to the target's
    compared: int
    peak_rss_mb: float


def _pooled_tps(samples: Sequence[Sample]) -> float:
    tok = sum(max(s.new_tokens - 1, 0) for s in samples)
    sec = sum(s.decode_s for s in samples)
    return tok / sec if sec > 0 else 0.0


def _row(group: str, mode: str, ss: Sequence[Sample], base: Sequence[Sample] | None) -> Row:
    tps = _pooled_tps(ss)
    base_tps = _pooled_tps(base) if base else 0.0
    speedup = tps / base_tps if base_tps > 0 else None
    rng = None
    if base:
        per_rep = []
        for rep in sorted({s.repeat for s in ss}):
            a = [s for s in ss if s.repeat == rep]
            b = [s for s in base if s.repeat == rep]
            bt = _pooled_tps(b)
            if a and bt > 0:
                per_rep.append(_pooled_tps(a) / bt)
        if len(per_rep) > 1:
            rng = (min(per_rep), max(per_rep))
    drafted = sum(s.drafted for s in ss)
    rounds = sum(max(s.target_passes - 1, 0) for s in ss)
    passes = sum(s.target_passes for s in ss)
    compared = [s for s in ss if s.same_as_target is not None]
    return Row(
        group=group, mode=mode, generations=len(ss), tokens=sum(max(s.new_tokens - 1, 0) for s in ss),
        tokens_per_s=tps, speedup=speedup, speedup_range=rng,
        ttft_ms=statistics.median(s.ttft_s for s in ss) * 1e3,
        acceptance=(sum(s.accepted for s in ss) / drafted) if drafted else None,
        tokens_per_pass=sum(s.new_tokens for s in ss) / passes if passes else 0.0,
        k_mean=(drafted / rounds) if rounds and mode != "target" else None,
        same=sum(1 for s in compared if s.same_as_target), compared=len(compared),
        peak_rss_mb=max(s.peak_rss_mb for s in ss),
    )


def summarize(run: BenchRun, by: str = "category") -> list[Row]:
    """Rows per group (`by` = "category" or "prompt") and mode, then the "all" group. Group order
    follows the prompts' order; mode order follows the run's."""
    key = (lambda s: s.category) if by == "category" else (lambda s: s.prompt_id)
    groups: list[str] = []
    for p in run.prompts:
        g = p.category if by == "category" else p.id
        if g not in groups:
            groups.append(g)
    rows: list[Row] = []
    labels = [m.label for m in run.modes]
    for g in groups + ([ALL] if by == "category" else []):
        in_g = [s for s in run.samples if g == ALL or key(s) == g]
        base = [s for s in in_g if s.mode == "target"]
        for label in labels:
            ss = [s for s in in_g if s.mode == label]
            if ss:
                rows.append(_row(g, label, ss, base))
    return rows


# --- where the time goes -------------------------------------------------------------------------
@dataclass
class Breakdown:
    """Decode time of one mode over the whole run, split by what ran, in ms per decode token."""

    mode: str
    tokens: int
    decode_ms_per_token: float
    target_ms_per_token: float
    draft_ms_per_token: float
    draft_catchup_ms_per_token: float  # long draft steps in decode: catching up after n-gram rounds
    overhead_ms_per_token: float  # the loop: sampling, n-gram lookup, Python
    target_steps: dict[int, tuple[int, float]] = field(default_factory=dict)  # n -> (count, mean ms)
    draft_steps: dict[int, tuple[int, float]] = field(default_factory=dict)


def breakdown(run: BenchRun) -> list[Breakdown]:
    from .modework import collect_work

    work = collect_work(run.samples)
    out = []
    for m in run.modes:
        w = work.get(m.label)
        if w is None or w.tokens == 0:
            continue
        t_s = sum(s for _, s in w.target_steps.values())
        d_dec = sum(s for n, (_, s) in w.draft_steps.items() if n < PREFILL_MIN_TOKENS)
        d_catch = sum(s for n, (_, s) in w.draft_steps.items() if n >= PREFILL_MIN_TOKENS)
        per = 1e3 / w.tokens
        out.append(Breakdown(
            mode=m.label, tokens=w.tokens, decode_ms_per_token=w.decode_s * per,
            target_ms_per_token=t_s * per, draft_ms_per_token=d_dec * per, draft_catchup_ms_per_token=d_catch * per,
            overhead_ms_per_token=w.overhead_s * per,
            target_steps={n: (c, s / c * 1e3) for n, (c, s) in sorted(w.target_steps.items()) if c},
            draft_steps={n: (c, s / c * 1e3) for n, (c, s) in sorted(w.draft_steps.items()) if c and n < PREFILL_MIN_TOKENS},
        ))
    return out


# --- text --------------------------------------------------------------------------------------
def _f(x: float | None, fmt: str, none: str = "-") -> str:
    return none if x is None else format(x, fmt)


def header(run: BenchRun) -> str:
    m = run.meta
    sets = sorted({p.set for p in run.prompts})
    sampling = "greedy" if m.get("temperature", 0.0) == 0.0 else f"temperature {m['temperature']}, seed {m.get('seed')}"
    load = m.get("loadavg_start")
    order = m.get("prompt_order", "file")
    return (f"edgespec bench: {m.get('bundle_name')} | prompts {', '.join(sets)} ({len(run.prompts)})"
            + ("" if order == "file" else f", {order} order") + f" | {sampling} | "
            f"{m.get('max_new_tokens')} new tokens | {m.get('repeats')} repeat(s), modes interleaved\n"
            f"measured on this machine: {m.get('cpu')} ({m.get('cpu_count')} CPUs), onnxruntime {m.get('onnxruntime')}"
            + (f", load average at start {load[0]:.2f}" if load else ""))


def format_table(rows: Sequence[Row], group_title: str = "category") -> str:
    cols = [group_title, "mode", "tok/s", "speed-up", "(per repeat)", "TTFT ms", "accept", "tok/pass", "k",
            "=target", "peak RSS MB"]
    lines = []
    prev = None
    for r in rows:
        lines.append([
            r.group if r.group != prev else "", r.mode, f"{r.tokens_per_s:.1f}",
            _f(r.speedup, ".2f") + ("x" if r.speedup is not None else ""),
            f"{r.speedup_range[0]:.2f}-{r.speedup_range[1]:.2f}" if r.speedup_range and r.mode != "target" else "",
            f"{r.ttft_ms:.0f}", _f(None if r.acceptance is None else r.acceptance * 100, ".0f") + ("%" if r.acceptance is not None else ""),
            f"{r.tokens_per_pass:.2f}", _f(r.k_mean, ".1f"),
            f"{r.same}/{r.compared}" if r.compared else "-", f"{r.peak_rss_mb:.0f}",
        ])
        prev = r.group
    return _grid(cols, lines, right_from=2)


def _grid(cols: list[str], lines: list[list[str]], right_from: int = 1) -> str:
    w = [max(len(c), *(len(x[i]) for x in lines)) if lines else len(c) for i, c in enumerate(cols)]

    def fmt(cells):
        return "  ".join(c.rjust(w[i]) if i >= right_from else c.ljust(w[i]) for i, c in enumerate(cells)).rstrip()

    return "\n".join([fmt(cols), fmt(["-" * x for x in w]), *(fmt(x) for x in lines)])


def _ms(ms: float) -> str:
    return f"{ms:.0f}" if ms >= 10 else f"{ms:.2g}"


def _steps(steps: dict[int, tuple[int, float]], show: int = 6) -> str:
    """'n x count @ mean ms' for the most frequent sizes (in size order), the rest summed up."""
    if not steps:
        return "-"
    top = sorted(sorted(steps, key=lambda n: -steps[n][0])[:show])
    parts = [f"{n}x{steps[n][0]}@{_ms(steps[n][1])}" for n in top]
    rest = [n for n in steps if n not in top]
    if rest:
        parts.append(f"(+{sum(steps[n][0] for n in rest)} steps of {len(rest)} other sizes)")
    return " ".join(parts)


def format_breakdown(bd: Sequence[Breakdown]) -> str:
    cols = ["mode", "ms/token", "target", "draft", "draft catch-up", "loop", "target steps: n x count @ mean ms",
            "draft steps"]
    lines = []
    for b in bd:
        ts = _steps(b.target_steps)
        ds = _steps(b.draft_steps)
        lines.append([b.mode, f"{b.decode_ms_per_token:.1f}", f"{b.target_ms_per_token:.1f}",
                      f"{b.draft_ms_per_token:.1f}", f"{b.draft_catchup_ms_per_token:.1f}",
                      f"{b.overhead_ms_per_token:.1f}", ts, ds])
    return _grid(cols, lines, right_from=1)


def _span(hi: float, lo: float | None, fmt: str, unit: str) -> str:
    """'lo-hi' (overlap is the high end) or one number when the two agree to the shown digits."""
    a, b = format(hi, fmt), format(lo, fmt) if lo is not None else None
    return f"{a}{unit}" if b is None or a == b else f"{min(lo, hi):{fmt}}-{max(lo, hi):{fmt}}{unit}"


def format_projection(projections: Sequence, hw_list: Sequence) -> str:
    """One line per board: the projected target-alone tokens/s and each mode's projected speed-up,
    then the modelled step costs and the assumptions behind them."""
    from .projection import cost_model_text

    out = ["PROJECTION to boards: a cost model fed with this run's acceptance and step counts, NOT a measurement",
           "(each figure is a range: memory and compute overlapping - adding up; priced for the graph flavor the "
           "board runs)"]
    modes: list[str] = []
    for p in projections:
        for m in p.modes:
            if m.mode != "target" and not m.mode.startswith("model, k=") and m.mode not in modes:
                modes.append(m.mode)
    cols = ["device", "target tok/s", *[f"{m}" for m in modes], "model, best k there", "fits memory"]
    lines = []
    for p in projections:
        by = {m.mode: m for m in p.modes}
        best = next((m for m in p.modes if m.mode.startswith("model, k=")), None)
        fits = getattr(p, "fit_text", "") or {True: "yes", False: "NO", None: "?"}[p.fits]
        lines.append([f"{p.device} ({getattr(p, 'flavor', 'cpu')})", _span(by['target'].tokens_per_s, by['target'].tokens_per_s_low, ".1f", ""),
                      *[_span(by[m].speedup, by[m].speedup_low, ".2f", "x") if m in by else "-" for m in modes],
                      f"k={best.mode.split('k=')[1].split()[0]}: {_span(best.speedup, best.speedup_low, '.2f', 'x')}"
                      if best else "-", fits])
    out.append("projected speed-up over the target alone on the same board:")
    out.append(_grid(cols, lines, right_from=1))
    out.append("modelled step costs (ms):")
    for p in projections:
        t = p.step_ms["target"]
        d = p.step_ms.get("draft", {}).get(1)
        out.append(f"  {p.device}: target 1 tok {t[1]:.1f}, 5 tok {t[5]:.1f} ({t[5] / t[1]:.2f}x), 9 tok {t[9]:.1f} "
                   f"({t[9] / t[1]:.2f}x)" + (f"; draft 1 tok {d:.1f} ({d / t[1]:.2f}x)" if d else "")
                   + (f"; prefill of the mean prompt {p.ttft_s * 1e3:.0f}" if p.ttft_s else ""))
    for p in projections:
        for n in getattr(p, "notes", []) or []:
            out.append(f"  note ({p.device}): {n}")
    out += cost_model_text(hw_list)
    out.append("  adaptive modes replay the k chosen on this machine (conservative where a long verify is cheap); "
               "'model, best k there' uses the per-token acceptance measured in the model mode.")
    return "\n".join(out)


def measured_steps_line(bd: Sequence[Breakdown]) -> str:
    """This machine's own step costs, for comparison with the modelled ones."""
    t: dict[int, list] = {}
    d: dict[int, list] = {}
    for b in bd:
        for n, (c, ms) in b.target_steps.items():
            cur = t.setdefault(n, [0, 0.0])
            cur[0] += c
            cur[1] += c * ms
        for n, (c, ms) in b.draft_steps.items():
            cur = d.setdefault(n, [0, 0.0])
            cur[0] += c
            cur[1] += c * ms
    if 1 not in t:
        return ""
    t1 = t[1][1] / t[1][0]
    parts = [f"target step 1 tok {t1:.1f} ms"]
    for n in sorted(t)[:9]:
        if n > 1:
            parts.append(f"{n} tok {t[n][1] / t[n][0]:.1f} ms ({t[n][1] / t[n][0] / t1:.2f}x)")
    if 1 in d:
        d1 = d[1][1] / d[1][0]
        parts.append(f"draft step {d1:.1f} ms ({d1 / t1:.2f}x)")
    return "measured step costs on this machine: " + ", ".join(parts)


def by_source(run: BenchRun) -> list[tuple[str, dict[str, int], dict[str, int]]]:
    """Per mode: decode rounds by where their proposals came from ("none": a plain step), and
    accepted proposals by source: what each drafter contributed."""
    out = []
    for m in run.modes:
        rounds: dict[str, int] = {}
        acc: dict[str, int] = {}
        for smp in run.samples:
            if smp.mode != m.label:
                continue
            for k, v in smp.rounds_by_source.items():
                rounds[k] = rounds.get(k, 0) + v
            for k, v in smp.accepted_by_source.items():
                acc[k] = acc.get(k, 0) + v
        if m.speculative and rounds:
            out.append((m.label, rounds, acc))
    return out


def format_by_source(rows) -> str:
    cols = ["mode", "rounds by source (share)", "accepted tokens by source"]
    lines = []
    for label, rounds, acc in rows:
        total = sum(rounds.values()) or 1
        r = " ".join(f"{k} {v} ({100 * v / total:.0f}%)" for k, v in sorted(rounds.items(), key=lambda x: -x[1]))
        a = " ".join(f"{k} {v}" for k, v in sorted(acc.items(), key=lambda x: -x[1])) or "-"
        lines.append([label, r, a])
    return _grid(cols, lines, right_from=len(cols))


def report_text(run: BenchRun, projections: Sequence = (), hw_list: Sequence = (), *, per_prompt: bool = False) -> str:
    rows = summarize(run, "category")
    parts = [header(run), "", format_table(rows)]
    if per_prompt:
        parts += ["", format_table(summarize(run, "prompt"), "prompt")]
    bd = breakdown(run)
    parts += ["", "where the decode time goes (ms per decode token, all prompts):", format_breakdown(bd)]
    line = measured_steps_line(bd)
    if line:
        parts.append(line)
    tl = tree_lines(run)
    if tl:
        parts += ["", "tree verification (tree rounds of each mode, all prompts):", *tl]
    forced = forced_lines(run)
    if forced:
        parts += ["", "structured output: the share of output tokens the grammar forced (proposed free by the "
                      "grammar drafter; prompts with a json_schema):", *forced]
    src = by_source(run)
    if src:
        parts += ["", "what each drafter contributed (all prompts):", format_by_source(src)]
    diffs = [s for s in run.samples if s.same_as_target is False]
    if diffs:
        worst = ", ".join(sorted({f"{s.prompt_id}/{s.mode}@{s.first_diff}" for s in diffs})[:8])
        parts.append(f"outputs that differ from the target alone (prompt/mode@first differing token): {worst}"
                     + (" (int4 kernels: near-tie argmax flips between 1-token and multi-token steps are expected)"
                        if any(m.get('quant') == 'int4' for m in run.meta.get("models", {}).values()) else ""))
    if not run.meta.get("rss_per_generation", True):
        parts.append("note: peak RSS is the process's peak so far (this OS cannot reset it per generation)")
    peers = run.meta.get("peers") or ([run.meta["peer"]] if run.meta.get("peer") else [])  # a run saved with one
    if peers:
        from .peer import format_peer

        for peer in peers:
            parts += ["", format_peer(peer, rows)]
    if run.meta.get("bound"):
        from .bound import format_bound

        parts += ["", format_bound(run.meta["bound"])]
    if projections:
        parts += ["", format_projection(projections, hw_list)]
    return "\n".join(parts)


def tree_lines(run: BenchRun) -> list[str]:
    """Per mode that verified trees: how many rounds, nodes per tree, accepted depth, and how many
    rounds the tree bought (the accepted path left the drafter's own chain)."""
    out = []
    for m in run.modes:
        ss = [s for s in run.samples if s.mode == m.label]
        rounds = sum(getattr(s, "tree_rounds", 0) for s in ss)
        if not rounds:
            continue
        all_rounds = sum(max(s.target_passes - 1, 0) for s in ss)
        nodes = sum(s.tree_nodes for s in ss)
        depth = sum(d * n for s in ss for d, n in s.accepted_depth.items())
        off = sum(s.tree_off_chain for s in ss)
        out.append(f"  {m.label}: {rounds} of {all_rounds} rounds were trees, {nodes / rounds:.1f} nodes each, "
                   f"accepted depth {depth / rounds:.2f}, {off} rounds accepted a path off the drafter's chain")
    return out


# --- JSON --------------------------------------------------------------------------------------
def report_json(run: BenchRun, projections: Sequence = ()) -> dict[str, Any]:
    d = run.to_dict()
    rows = summarize(run, "category")
    d["summary"] = {"by_category": [asdict(r) for r in rows],
                    "by_prompt": [asdict(r) for r in summarize(run, "prompt")]}
    d["breakdown"] = [asdict(b) for b in breakdown(run)]
    d["projection"] = [p.to_dict() for p in projections]
    return d


def write_json(path, data: dict) -> None:
    from pathlib import Path

    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=_jsonable) + "\n", encoding="utf-8")
    tmp.replace(p)


def _jsonable(x):
    if isinstance(x, tuple):
        return list(x)
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")
