"""Projection of a bench run to another board: "would speculation pay on a Jetson or a Pi?"

What transfers from this machine and what does not:
- acceptance, and so how many steps of each size a mode needs per generated token, depends on the
  models and the text, not on the device: it is *measured* here (the runners' step counts by number
  of tokens, for every generation of the run, summed per mode in bench/modework.py);
- the cost of a step depends on the device: it is *modelled* there, as a roofline plus a fixed cost:

      t(model, n tokens) = launch + max(bytes_read / (B * eff_b), 2 * params * n / (C * eff_c))   (overlap)
      t(model, n tokens) = launch + bytes_read / (B * eff_b) + 2 * params * n / (C * eff_c)      (no overlap)

  Whether a board's kernels overlap reading the weights with computing on them is not known here,
  so both are computed and every projected figure is a range: the first is the optimistic end.

  bytes_read = the model's weights + its KV cache at the run's mean context, of the graph flavor the
  board runs (Jetson: the cuda flavor, float16 KV; Pi: the cpu flavor, float32 KV); B = the board's memory
  bandwidth (its device profile); C = the board's peak compute for the weight matmuls on the path
  edgespec uses there (on a Jetson the cuda flavor's MatMulNBits: 4/8-bit weights dequantized to fp16,
  tensor cores for multi-row steps; int8 dot products on the Pi's CPU cores),
  both below; eff_* = the fraction of peak such kernels reach; launch = per-layer fixed cost
  (kernel launches on a GPU, thread synchronisation on a CPU).

The projected time of a mode is the measured step counts times the modelled step costs, plus the
loop's own measured overhead (Python, sampling, n-gram lookup) scaled by the board's CPU speed
relative to this one. Adaptive modes chose their k from *this* machine's costs; on a board where a
long verify costs about one step they would draft more, so their projection is conservative. The
"model, k for the board" row answers that: the best fixed k under the measured acceptance and the
board's costs.

Everything here is a model, labelled as such wherever it is printed, and never mixed with
measured figures.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from ..core.costmodel import expected_tokens
from ..errors import InvalidRequest
from ..limits import DEFAULT_MAX_LEN
from .modework import ModeWork, acceptance_estimate, prefill_chunks

GB = 1e9


@dataclass(frozen=True)
class Hardware:
    """A board as the cost model sees it (the part of a device profile that sets step costs)."""

    id: str
    name: str
    bandwidth_gbs: float  # peak memory bandwidth
    compute_tops: float  # peak ops/s (x1e12) of the weight-matmul path used there
    path: str  # what runs the matmuls, in words
    eff_bandwidth: float  # fraction of peak bandwidth a decode step reaches
    eff_compute: float  # fraction of peak compute a multi-token step reaches
    launch_ms_per_layer: float  # fixed cost per layer per step
    cpu_speed: float  # host-side loop speed relative to the dev machine's CPU (1.0 = same)
    memory_budget_bytes: int | None = None
    basis: str = ""  # where the compute figure comes from
    flavor: str = "cpu"  # the bundle graph the board runs (manifest flavors): "cuda" on a Jetson


# Compute figures are peak numbers derived from the chips' published configurations (SM count and
# GPU clock for Orin: 1024 dense fp16 FMA per SM per clock; A76/A72 NEON throughput x cores x clock).
# Efficiencies and fixed costs are assumptions of this model, stated in docs/bench.md.
_COMPUTE: dict[str, dict[str, Any]] = {
    "jetson-orin-nano-8gb": dict(compute_tops=10.2, path="GPU (CUDA), cuda flavor: 4/8-bit MatMulNBits dequantized to fp16", flavor="cuda", eff_bandwidth=0.7,
                                 eff_compute=0.4, launch_ms_per_layer=0.12, cpu_speed=0.35,
                                 basis="8 SMs x 1024 fp16 FMA/clk x 0.625 GHz (the 'Super' modes clock higher)"),
    "jetson-orin-nx-16gb": dict(compute_tops=15.0, path="GPU (CUDA), cuda flavor: 4/8-bit MatMulNBits dequantized to fp16", flavor="cuda", eff_bandwidth=0.7,
                                eff_compute=0.4, launch_ms_per_layer=0.10, cpu_speed=0.45,
                                basis="8 SMs x 1024 fp16 FMA/clk x 0.918 GHz"),
    "jetson-agx-orin-64gb": dict(compute_tops=42.6, path="GPU (CUDA), cuda flavor: 4/8-bit MatMulNBits dequantized to fp16", flavor="cuda", eff_bandwidth=0.7,
                                 eff_compute=0.4, launch_ms_per_layer=0.08, cpu_speed=0.5,
                                 basis="16 SMs x 1024 fp16 FMA/clk x 1.3 GHz"),
    "Cortex-A76": dict(compute_tops=0.61, path="CPU, 4x Cortex-A76, int8 dot products (MatMulNBits)", eff_bandwidth=0.6,
                       eff_compute=0.3, launch_ms_per_layer=0.03, cpu_speed=0.45,
                       basis="4 cores x 2.4 GHz x 64 int8 ops/clk (2x 128-bit SDOT)"),
    "Cortex-A72": dict(compute_tops=0.23, path="CPU, 4x Cortex-A72, NEON int8 (no dot product)", eff_bandwidth=0.5,
                       eff_compute=0.3, launch_ms_per_layer=0.05, cpu_speed=0.2,
                       basis="4 cores x 1.8 GHz x 32 int8 ops/clk"),
}


def hardware(device: str) -> Hardware:
    """The cost-model view of a device profile (by id or alias, see `edgespec doctor`)."""
    from ..edge import devices

    p = devices.get(device)
    spec = _COMPUTE.get(p.id) or _COMPUTE.get(p.cpu_model or "")
    if spec is None or not p.bandwidth_gbs:
        raise InvalidRequest(
            f"no projection for {p.id}: the cost model needs its memory bandwidth and compute "
            f"(known: {', '.join(projectable())})", param="project")
    return Hardware(id=p.id, name=p.name, bandwidth_gbs=float(p.bandwidth_gbs), memory_budget_bytes=p.memory_budget_bytes,
                    **spec)


DISTINCT_MIN_GIB = 4


def projectable(*, distinct: bool = False) -> list[str]:
    """Ids of the device profiles the model has figures for. `distinct`: one per kind of hardware
    (board variants that differ only in memory size give the same speeds), the smallest-memory one,
    whose memory is the question; a variant without a size of its own (a CM5, a Pi 500) only where no sized one
    stands for that kind, and none under DISTINCT_MIN_GIB (a 1 or 2 GB Pi 5, which the default pair does not
    fit): those are projected by name."""
    from ..edge import devices

    out: dict[tuple, tuple[tuple[bool, int], str]] = {}
    for pid, p in sorted(devices.profiles().items()):
        key = pid if pid in _COMPUTE else (p.cpu_model or "")
        if not p.bandwidth_gbs or key not in _COMPUTE:
            continue
        if distinct and p.memory_bytes is not None and p.memory_bytes < DISTINCT_MIN_GIB << 30:
            continue
        k = (key, p.bandwidth_gbs) if distinct else (pid,)
        rank = (p.memory_bytes is None, p.memory_bytes or 0)  # a known size first, then the smallest
        if k not in out or rank < out[k][0]:
            out[k] = (rank, pid)
    return sorted(pid for _, pid in out.values())


def resolve_devices(spec: str | None) -> list[Hardware]:
    """--project value: "boards" (one of each kind), "all" (every profile), "none", or names."""
    if spec is None or spec.strip().lower() in ("", "none"):
        return []
    if spec.strip().lower() == "boards":
        return [hardware(d) for d in projectable(distinct=True)]
    if spec.strip().lower() == "all":
        return [hardware(d) for d in projectable()]
    return [hardware(d.strip()) for d in spec.split(",") if d.strip()]


# --- the models as the cost model sees them ------------------------------------------------------
@dataclass(frozen=True)
class ModelCost:
    role: str
    weight_bytes: int  # bytes read per step (graph weights on disk; int4 blocks + scales)
    params: int  # parameters doing 2 flops per token in a matmul
    layers: int
    kv_bytes_per_token: int
    # flavor -> (weight_bytes, kv_bytes_per_token) of each graph the bundle holds; empty: one graph,
    # the fields above, whose flavor is `flavor`
    graphs: dict = field(default_factory=dict, compare=False, hash=False)
    flavor: str = "cpu"

    def for_flavor(self, flavor: str) -> tuple["ModelCost", str]:
        """The cost of the graph of `flavor`, and a note when the bundle has none (priced as if it did:
        same weight bytes, KV at float16 for cuda)."""
        from dataclasses import replace

        if flavor in self.graphs:
            wb, kv = self.graphs[flavor]
            return replace(self, weight_bytes=int(wb), kv_bytes_per_token=int(kv), flavor=flavor), ""
        if flavor == self.flavor:
            return self, ""
        kv = self.kv_bytes_per_token // 2 if flavor == "cuda" and self.flavor == "cpu" else self.kv_bytes_per_token
        note = (f"the bundle's {self.role} has no {flavor} graph: priced as if re-exported with --ep {flavor} "
                f"(the runtime would refuse its {self.flavor} graph on CUDA)" if flavor == "cuda" else
                f"the bundle's {self.role} has no {flavor} graph: priced with its {self.flavor} graph")
        return replace(self, kv_bytes_per_token=kv, flavor=flavor), note


def graph_costs(bundle, role: str) -> dict[str, tuple[int, int]]:
    """flavor -> (bytes of that graph's files, its KV bytes per token), for every graph of `role`."""
    files = bundle.manifest.files
    out = {}
    for flavor, g in bundle.manifest.models[role].graphs().items():
        nbytes = sum(files.get(rel, {}).get("size", 0) for rel in (g.path, g.path + ".data"))
        out[flavor] = (nbytes, g.kv_bytes_per_token())
    return out


def model_costs(bundle) -> dict[str, ModelCost]:
    out = {}
    for role, f in bundle.manifest.models.items():
        graphs = graph_costs(bundle, role)
        wb, kv = graphs[f.graph_flavor()]
        params = f.params or _params_from_bytes(wb, f.quant)
        out[role] = ModelCost(role, wb, params, f.layers, kv, graphs=graphs, flavor=f.graph_flavor())
    return out


def model_costs_from_meta(meta: dict) -> dict[str, ModelCost]:
    """The same, from a saved run's meta (so a run can be projected again without its bundle)."""
    out = {}
    for role, m in (meta.get("models") or {}).items():
        if "kv_bytes_per_token" not in m:
            raise InvalidRequest("this bench JSON predates the projection data (no kv_bytes_per_token): run the "
                                 "bench again", param="project")
        graphs = {fl: (int(g["bytes"]), int(g["kv_bytes_per_token"])) for fl, g in (m.get("graphs") or {}).items()}
        flavor = m.get("flavor") or "cpu"
        wb, kv = graphs.get(flavor, (int(m["bytes"]), int(m["kv_bytes_per_token"])))
        params = int(m.get("params") or 0) or _params_from_bytes(wb, m.get("quant", "int4"))
        out[role] = ModelCost(role, wb, params, int(m["layers"]), kv, graphs=graphs, flavor=flavor)
    return out


def _params_from_bytes(nbytes: int, quant: str) -> int:
    # int4 graphs keep some tensors (norms, biases, often embeddings / lm_head) at higher precision:
    # the default pair measures 0.73-0.82 bytes per parameter on disk
    per = {"int4": 0.75, "int8": 1.2, "fp16": 2.0, "fp32": 4.0}.get(quant, 1.0)
    return int(nbytes / per)


def step_seconds(m: ModelCost, hw: Hardware, n: int, context: float, *, overlap: bool = True) -> float:
    """Modelled wall time of one step of `n` tokens at `context` tokens of cache, on `hw`.
    `overlap`: memory and compute overlap (max of the two), else they add up (the slow end)."""
    bytes_read = m.weight_bytes + m.kv_bytes_per_token * context
    t_mem = bytes_read / (hw.bandwidth_gbs * GB * hw.eff_bandwidth)
    t_cmp = 2.0 * m.params * n / (hw.compute_tops * 1e12 * hw.eff_compute)
    return hw.launch_ms_per_layer * 1e-3 * m.layers + (max(t_mem, t_cmp) if overlap else t_mem + t_cmp)


# --- the projection -------------------------------------------------------------------------------
@dataclass
class ProjectedMode:
    mode: str
    tokens_per_s: float
    speedup: float  # vs the projected target alone on the same board
    target_s_per_token: float
    draft_s_per_token: float
    overhead_s_per_token: float
    note: str = ""
    tokens_per_s_low: float | None = None  # the same with memory and compute adding up (no overlap)
    speedup_low: float | None = None


@dataclass
class Projection:
    device: str
    name: str
    path: str
    fits: bool | None  # the memory plan for the board fits its budget (edge/boardfit.py, as `plan` says)
    step_ms: dict[str, dict[int, float]]  # role -> n -> modelled ms (what the board pays per step)
    modes: list[ProjectedMode]
    ttft_s: float | None  # modelled prefill of the run's mean prompt
    hardware: dict[str, Any]
    flavor: str = "cpu"  # the graph flavor priced (the one the board runs)
    notes: list[str] = field(default_factory=list)
    fit_text: str = ""  # the plan's outcome in words ("yes (62 %)", "without the draft (88 %)", "NO: ...")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["kind"] = "projection (a cost model, not a measurement)"
        return d


def project(work: dict[str, ModeWork], costs: dict[str, ModelCost], hw: Hardware, *, max_len: int = DEFAULT_MAX_LEN,
            k_max: int = 8, need_bytes: int | None = None, fit: dict | None = None) -> Projection:
    """Projects every mode in `work` (which must include "target") to `hw`. `fit`: the memory plan's
    answer for this board (edge/boardfit.py, kept in the run's JSON as meta.board_fits): what
    `edgespec plan --device` says. Without it (a JSON saved before board_fits existed), `need_bytes`,
    the planner's estimate for the run's own engine (else weights + KV at max_len, plus 15 %), is
    compared with the board's budget."""
    if "target" not in work or work["target"].tokens == 0:
        raise ValueError("the projection needs the target-alone generations of the run")
    notes: list[str] = []
    tgt, note = costs["target"].for_flavor(hw.flavor)
    notes += [note] if note else []
    drf = None
    if costs.get("draft") is not None:
        drf, note = costs["draft"].for_flavor(hw.flavor)
        notes += [note] if note else []
    ctx = work["target"].mean_context
    rows = _rows(work, tgt, drf, hw, ctx, k_max, overlap=True)
    low = {r.mode.split(" k=")[0] if r.mode.startswith("model, k=") else r.mode: r
           for r in _rows(work, tgt, drf, hw, ctx, k_max, overlap=False)}
    for r in rows:
        lo = low.get(r.mode.split(" k=")[0] if r.mode.startswith("model, k=") else r.mode)
        if lo is not None:
            r.tokens_per_s_low, r.speedup_low = lo.tokens_per_s, lo.speedup

    def t_target(n: int) -> float:
        return step_seconds(tgt, hw, n, ctx)

    def t_draft(n: int) -> float:
        return step_seconds(drf, hw, n, ctx) if drf is not None else 0.0

    step_ms = {"target": {n: round(t_target(n) * 1e3, 2) for n in (1, 2, 3, 5, 9)}}
    if drf is not None:
        step_ms["draft"] = {1: round(t_draft(1) * 1e3, 2)}
    mean_prompt = work["target"].prompt_tokens / max(work["target"].generations, 1)
    ttft = sum(step_seconds(tgt, hw, n, n / 2) for n in prefill_chunks(int(mean_prompt), 512)) if mean_prompt else None
    if need_bytes is None:
        kv = (tgt.kv_bytes_per_token + (drf.kv_bytes_per_token if drf else 0)) * max_len
        need_bytes = int(1.15 * (tgt.weight_bytes + (drf.weight_bytes if drf else 0) + kv))
    fits = None if hw.memory_budget_bytes is None else need_bytes <= hw.memory_budget_bytes
    fit_text = ""
    if fit is not None:
        fits, fit_text = fit.get("fits"), str(fit.get("text") or "")
    return Projection(hw.id, hw.name, hw.path, fits, step_ms, rows, ttft, asdict(hw), flavor=hw.flavor, notes=notes,
                      fit_text=fit_text)


def _rows(work: dict[str, ModeWork], tgt: ModelCost, drf: ModelCost | None, hw: Hardware, ctx: float, k_max: int,
          *, overlap: bool) -> list[ProjectedMode]:
    """Every mode's projected rate (and the draft model at the board's best k) under one step model."""
    def t_target(n: int) -> float:
        return step_seconds(tgt, hw, n, ctx, overlap=overlap)

    def t_draft(n: int) -> float:
        return step_seconds(drf, hw, n, ctx, overlap=overlap) if drf is not None else 0.0

    rows: list[ProjectedMode] = []
    base_rate = None
    for name, w in work.items():
        if w.tokens == 0:
            continue
        ts = sum(c * t_target(n) for n, (c, _) in w.target_steps.items())
        ds = sum(c * t_draft(n) for n, (c, _) in w.draft_steps.items())
        ov = w.overhead_s / hw.cpu_speed
        rate = w.tokens / (ts + ds + ov)
        rows.append(ProjectedMode(name, rate, 0.0, ts / w.tokens, ds / w.tokens, ov / w.tokens,
                                  note="k as chosen on this machine" if "k=" not in name and name != "target" else ""))
        if name == "target":
            base_rate = rate
    # the draft model with the k that is best on this board, under the acceptance measured here
    est = acceptance_estimate(work)
    if drf is not None and est is not None:
        a, source, mw = est
        ov_tok = mw.overhead_s / hw.cpu_speed / max(mw.tokens, 1)
        best = None
        for k in range(1, k_max + 1):
            e = expected_tokens(k, a)
            t_round = k * t_draft(1) + t_target(k + 1)
            r = e / (t_round + ov_tok * e)
            if best is None or r > best[1]:
                best = (k, r, t_round, e)
        k, r, t_round, e = best
        rows.append(ProjectedMode(
            f"model, k={k} for this board", r, 0.0, t_target(k + 1) / e, k * t_draft(1) / e, ov_tok,
            note=f"per-token acceptance a={a:.2f} {source}, E[tokens/round]={e:.2f}"))
    for r in rows:
        r.speedup = r.tokens_per_s / base_rate if base_rate else float("nan")
    return rows


def cost_model_text(hw_list: Sequence[Hardware]) -> list[str]:
    """The assumptions, in words, for the report."""
    lines = [
        "cost model: t(step of n tokens) = launch/layer x layers + max(bytes / (B x eff_b), 2 x params x n / (C x eff_c));",
        "  steps per token by size are the ones measured in this run; loop overhead = measured / cpu_speed.",
    ]
    for hw in hw_list:
        lines.append(f"  {hw.id}: B={hw.bandwidth_gbs:g} GB/s x {hw.eff_bandwidth:g}, C={hw.compute_tops:g} TOPS x "
                     f"{hw.eff_compute:g} ({hw.path}; {hw.basis}), launch {hw.launch_ms_per_layer:g} ms/layer, "
                     f"cpu_speed {hw.cpu_speed:g}")
    return lines
