"""`bench --pin-costs FILE`: a replay in which every step costs what FILE says, whatever the clock reads.

Why: a drafting policy (`auto` above all) decides from measured step costs, and on a 2-core board those
move by 3-10 % between two passes over the same prompts, so two runs of the same code choose
differently and a category of three prompts moves by more than the 2 % the issue 21 rule asks to see
(docs/speed.md, round nine). With the costs fixed, a run decides the same every time: two policies
compared this way differ only where their decisions differ, and the decode times are those decisions
priced at one table of costs. It is a replay of decisions, not a speed measurement; the report says so.

FILE is a bench JSON (its decode steps' mean cost per size, as the "priced" column uses) or a table:
    {"target": {"1": 0.0334, "2": 0.0391, ...}, "draft": {"1": 0.0133, "2": 0.0152, ...}}
in seconds per step by tokens in the step. A size the table lacks costs the straight line between the
sizes around it, past the largest the slope of its three largest (CostTable).

Or `device:ID`, a board of `--project` (a Jetson, a Pi): the table is the projection's cost model of
that board for this bundle's graphs (projection.step_tables), so the run re-decides every round as
`auto` would there. A projection of the board, not a measurement of it; the report says so.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ..errors import InvalidRequest
from .modework import decode_steps, mean_costs, priced_sample


class CostTable(dict):
    """Seconds per step by tokens in the step; a size not in it is interpolated (see the module doc)."""

    def __missing__(self, n: int) -> float:
        sizes = sorted(self)
        lo = [x for x in sizes if x < n]
        hi = [x for x in sizes if x > n]
        if not lo:
            return self[hi[0]]
        if hi:
            a, b = lo[-1], hi[0]
            return self[a] + (self[b] - self[a]) * (n - a) / (b - a)
        top = sizes[-3:]
        if len(top) < 2:
            return self[top[-1]] * n / top[-1]  # one size known: its cost per token
        slope = (self[top[-1]] - self[top[0]]) / (top[-1] - top[0])
        return self[top[-1]] + max(0.0, slope) * (n - top[-1])


@dataclass(frozen=True)
class PinnedCosts:
    """The costs every step of a pinned run is priced at, and where they came from."""

    target: CostTable
    draft: CostTable | None  # None: the file prices no draft step (then no mode may run one)
    source: str

    def apply(self, engine) -> None:
        """Fixes the step costs the engine's decisions read (its target's and draft's StepTimes)."""
        drafts = [r for r in (getattr(engine, n, None) for n in ("draft_runner", "self_runner"))
                  if r is not None and hasattr(r, "times")]
        if drafts:
            self.need_draft("the engine runs a draft")  # before anything is fixed
        engine.target.times.fix(self.target.__getitem__)
        for runner in drafts:
            runner.times.fix(self.draft.__getitem__)

    def need_draft(self, runs: str) -> None:
        """Refuses a run with draft steps this file cannot price (`runs`: what runs them). The CLI asks
        before the models load; apply() asks again for any other caller of run_bench."""
        if self.draft is None:
            raise InvalidRequest(f"--pin-costs {self.source}: it prices no draft step, and {runs}: give a 'draft' "
                                 "table, or a bench JSON from a run with the draft", param="pin_costs")

    def reprice(self, s):
        """A bench Sample with its decode steps at these costs (modework.priced_sample: its decode time
        is its loop's own time, measured, plus the steps' pinned seconds), and its step histograms
        saying so. The prompt's prefill chunks (before the first token, in the TTFT) keep their
        measured seconds."""
        draft = self.draft if self.draft is not None else {}  # apply(): then no draft step has run
        r = priced_sample(s, self.target, draft)
        hists = []
        for hist, dec, table in zip((s.target_steps, s.draft_steps), decode_steps(s), (self.target, draft)):
            # dec[n][0] of the c steps of size n were decode steps: those cost table[n] now
            hists.append({n: [c, sec + (dec[n][0] * (table[n] - sec / c) if n in dec else 0.0)]
                          for n, (c, sec) in hist.items()})
        tps = (s.new_tokens - 1) / r.decode_s if r.decode_s > 0 and s.new_tokens > 1 else 0.0
        return replace(r, decode_tps=tps, target_steps=hists[0], draft_steps=hists[1])

    def describe(self) -> dict[str, Any]:
        return {"source": self.source, "target": dict(self.target), "draft": dict(self.draft or {})}


DEVICE = "device:"  # `--pin-costs device:ID`: a board's modelled costs instead of a file


def pinned_device(spec: str):
    """The board (projection.Hardware) a `device:ID` spec names, None for a file path; an unknown or
    unprojectable board is refused here, before the models load, naming the boards that work."""
    if not spec.startswith(DEVICE):
        return None
    from .projection import hardware, projectable

    name = spec[len(DEVICE):].strip()
    try:
        if not name:
            raise InvalidRequest("names no board")
        return hardware(name)
    except InvalidRequest as e:
        raise InvalidRequest(f"--pin-costs {spec}: {e} (boards with a cost model: {', '.join(projectable())})",
                             param="pin_costs") from None


def device_pinned(hw, costs: dict) -> PinnedCosts:
    """The replay's table for board `hw` and a bundle's models (projection.model_costs)."""
    from .projection import step_tables

    t, notes = step_tables(costs, hw)
    draft = CostTable(t["draft"]) if "draft" in t else None
    return PinnedCosts(CostTable(t["target"]), draft,
                       f"{DEVICE}{hw.id} (a cost model of the board at its slow end: projected, not measured"
                       + "".join(f"; {n}" for n in notes) + ")")


def _table(raw: Any, what: str, path: str) -> CostTable:
    if not isinstance(raw, dict) or not raw:
        raise InvalidRequest(f"--pin-costs {path}: '{what}' must be a non-empty object of tokens -> seconds",
                             param="pin_costs")
    out = CostTable()
    for k, v in raw.items():
        try:
            n = int(k)
        except (TypeError, ValueError):
            n = 0
        if n < 1:
            raise InvalidRequest(f"--pin-costs {path}: '{what}' key {k!r} is not a step size (an integer >= 1)",
                                 param="pin_costs")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise InvalidRequest(f"--pin-costs {path}: '{what}'[{k}] must be seconds > 0, got {v!r}",
                                 param="pin_costs")
        out[n] = float(v)
    return out


def load_pinned(path: str | Path) -> PinnedCosts:
    """The table in a costs file or in a bench JSON's decode steps; a clear error naming what is wrong."""
    p = Path(path)
    try:
        raw = json.loads(p.read_text())
    except OSError as e:
        raise InvalidRequest(f"--pin-costs {path}: cannot read it ({e.strerror or e})", param="pin_costs") from None
    except ValueError as e:
        raise InvalidRequest(f"--pin-costs {path}: not JSON ({e})", param="pin_costs") from None
    if isinstance(raw, dict) and "samples" in raw:
        return _from_run(raw, str(path))
    if not isinstance(raw, dict) or "target" not in raw:
        raise InvalidRequest(f"--pin-costs {path}: expected a bench JSON or "
                             '{"target": {...}, "draft": {...}}', param="pin_costs")
    target = _table(raw["target"], "target", str(path))
    draft = _table(raw["draft"], "draft", str(path)) if "draft" in raw else None
    return PinnedCosts(target, draft, str(path))


def _from_run(raw: dict, path: str) -> PinnedCosts:
    try:
        samples = [SimpleNamespace(prompt_tokens=int(s["prompt_tokens"]), target_steps=s["target_steps"],
                                   draft_steps=s.get("draft_steps", {})) for s in raw["samples"]]
        t, d = mean_costs(samples)
    except (KeyError, TypeError, ValueError) as e:
        raise InvalidRequest(f"--pin-costs {path}: not a bench JSON written by `edgespec bench --json` "
                             f"({type(e).__name__}: {e})", param="pin_costs") from None
    if not t:
        raise InvalidRequest(f"--pin-costs {path}: the run has no decode steps to take costs from", param="pin_costs")
    return PinnedCosts(CostTable(t), CostTable(d) if d else None, path)
