"""What each mode of a bench run did, summed from its measured samples: the half of a projection
that transfers to another board (bench/projection.py prices it there).

Acceptance, and so how many steps of each size a mode needs per generated token, depends on the
models and the text, not on the device: the runners' step histograms (tokens per step -> [count,
seconds]) of every generation are summed per mode here, with the prompt's prefill taken out, and
the draft model's per-token acceptance is recovered from them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable


@dataclass
class ModeWork:
    """Everything the projection needs about one mode's generations, summed over samples."""

    mode: str
    tokens: int = 0  # decode tokens (each generation's tokens after its first)
    decode_s: float = 0.0  # measured decode time on this machine
    target_steps: dict[int, list] = field(default_factory=dict)  # decode steps: n -> [count, seconds]
    draft_steps: dict[int, list] = field(default_factory=dict)
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    context_sum: float = 0.0  # sum of mean context per generation (for the KV term)
    generations: int = 0
    prompt_tokens: int = 0

    @property
    def step_s(self) -> float:
        return sum(s for _, s in self.target_steps.values()) + sum(s for _, s in self.draft_steps.values())

    @property
    def overhead_s(self) -> float:
        """Decode time not spent in any model step: the loop itself."""
        return max(self.decode_s - self.step_s, 0.0)

    @property
    def mean_context(self) -> float:
        return self.context_sum / self.generations if self.generations else 0.0


def add_steps(acc: dict[int, list], steps: dict) -> None:
    for n, (c, s) in steps.items():
        n = int(n)
        cur = acc.setdefault(n, [0, 0.0])
        cur[0] += c
        cur[1] += s


def collect_work(samples: Iterable) -> dict[str, ModeWork]:
    """Sums decode-phase steps per mode. The prompt's prefill chunks run before the first token, so
    outside the decode time: the target's always, the draft's when the engine fed it the prompt along
    with the target (model and auto modes); they are taken out of both histograms here."""
    out: dict[str, ModeWork] = {}
    for s in samples:
        w = out.setdefault(s.mode, ModeWork(s.mode))
        w.tokens += max(s.new_tokens - 1, 0)
        w.decode_s += s.decode_s
        w.rounds += max(s.target_passes - 1, 0)
        w.drafted += s.drafted
        w.accepted += s.accepted
        w.generations += 1
        w.prompt_tokens += s.prompt_tokens
        w.context_sum += s.prompt_tokens + s.new_tokens / 2
        target, draft = decode_steps(s)
        add_steps(w.target_steps, target)
        add_steps(w.draft_steps, draft)
    return out


def decode_steps(s) -> tuple[dict[int, list], dict[int, list]]:
    """One sample's (target, draft) step histograms with its prompt's prefill chunks taken out."""
    from ..limits import PREFILL_CHUNK

    chunks = prefill_chunks(s.prompt_tokens, PREFILL_CHUNK)
    return _without(s.target_steps, chunks), _without(s.draft_steps, chunks)


def _without(steps: dict, chunks: list[int]) -> dict[int, list]:
    """A step histogram {tokens: [count, seconds]} less one step of each size in `chunks` (at the
    size's mean time); sizes it lacks are left alone."""
    out = {int(n): list(v) for n, v in steps.items()}
    for n in chunks:
        if n in out and out[n][0] > 0:
            c, sec = out[n]
            out[n] = [c - 1, sec - sec / c]
    return {n: v for n, v in out.items() if v[0] > 0}


def prefill_chunks(prompt_tokens: int, chunk: int) -> list[int]:
    full, rest = divmod(prompt_tokens, chunk)
    return [chunk] * full + ([rest] if rest else [])


# --- per-token acceptance -----------------------------------------------------------------------
def per_token_acceptance(accepted: int, rounds_with_drafts: int, k: float) -> float | None:
    """The a of the i.i.d. model (each proposal accepted with probability a once all before it
    were) that explains `accepted` tokens over `rounds_with_drafts` rounds of about k proposals:
    solves a + a^2 + ... + a^k = accepted / rounds by bisection."""
    if rounds_with_drafts <= 0 or k <= 0:
        return None
    target = accepted / rounds_with_drafts
    kk = max(1, round(k))
    if target <= 0:
        return 0.0
    if target >= kk:
        return 1.0

    def f(a: float) -> float:
        return sum(a ** i for i in range(1, kk + 1))

    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if f(mid) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def acceptance_estimate(work: dict[str, ModeWork]) -> tuple[float, str, ModeWork] | None:
    """The per-token acceptance a of the draft model, from the fixed-k model mode with the largest k
    if the run has one (every round then proposes k, so a is measured as the i.i.d. model means it);
    else from the adaptive model mode, whose drafter stops before tokens it is unsure of: that a
    is optimistic, and says so."""
    fixed = []
    for name, w in work.items():
        base, _, k = name.partition(" k=")
        if base == "model" and k.isdigit() and w.rounds and w.drafted:
            fixed.append((int(k), name, w))
    if fixed:
        k, name, w = max(fixed)
        a = per_token_acceptance(w.accepted, w.rounds, w.drafted / w.rounds)
        return (a, f"(from '{name}')", w) if a is not None else None
    w = work.get("model")
    if w is None or not w.rounds or not w.drafted:
        return None
    a = per_token_acceptance(w.accepted, w.rounds, w.drafted / w.rounds)
    if a is None:
        return None
    return a, "(from adaptive 'model': optimistic; run with --k 4 to measure it at fixed k)", w


def forced_lines(run) -> list[str]:
    """Per mode, over the prompts with a schema: forced tokens / output tokens (the same text, so the
    same share, in every mode whose output equals the target's)."""
    with_schema = {p.id for p in run.prompts if getattr(p, "json_schema", None) is not None}
    out = []
    for m in run.modes:
        ss = [s for s in run.samples if s.mode == m.label and s.prompt_id in with_schema]
        total = sum(s.new_tokens for s in ss)
        if total:
            forced = sum(getattr(s, "forced_tokens", 0) for s in ss)
            out.append(f"  {m.label}: {forced} of {total} tokens ({100 * forced / total:.0f} %)")
    return out
