"""The decode loop of one request: prefill what the cache lacks, then speculative rounds (engine/round.py,
as the batch of one) until a stop.

    decode(parts, req, drafter, k_cap, cache) -> generator of text deltas, returning GenerationResult

Stop conditions: EOS ids, stop strings (also when split across tokens), max_new_tokens (all three
in `Emitter`, the stop/emit step the batched engine shares), a full cache, and `cancel` (checked
before every target pass). Prefix reuse: `cache.tokens` is what the
target cache holds (a prefix of it); a request rewinds to the longest common prefix and prefills only
the rest. Rewinding is exact, so reuse never changes the output.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Generator, Iterator

from ..core.detokenize import TextStream
from ..core.proposal import common_prefix
from ..core.runner import ModelRunner
from ..core.sampling import make_rng
from ..core.speculative import first_token
from ..drafters.base import Drafter
from .requests import Request
from .results import GenerationResult, GenerationStats
from .round import Conditions, Governor, OneSlot, Seq, run_round
from .tree_round import TreeVerifier


@dataclass
class Parts:
    """What the engine lends the loop for one request."""

    target: ModelRunner
    tokenizer: object
    eos_ids: frozenset[int]
    usable: int  # ids >= usable are never chosen (logits padding rows)
    prefill_chunk: int
    free_drafter: Drafter  # what a "free drafts only" limit falls back to for a drafter that uses a model
    governor: Governor | None = None
    tree: TreeVerifier | None = None  # runs the rounds when given (chain or tree, per req.tree)
    # called with the request's whole text when it ends, whatever its mode (the suffix index records it)
    on_end: Callable[[list[int]], None] | None = None


@dataclass
class PrefixCache:
    """The tokens whose K/V the target cache holds (a prefix of this list)."""

    tokens: list[int] = field(default_factory=list)

    def clear(self) -> None:
        self.tokens = []


class Emitter:
    """The stop/emit step of one request, shared by the serial loop and the batched engine: a round's
    tokens become text deltas until EOS, a stop string (also split across tokens) or max_new_tokens.
    After `push`, `finish` is "stop" | "length" when one of them hit (else None) and `out` holds the
    tokens emitted (not the EOS)."""

    def __init__(self, tokenizer, req: Request, eos_ids: frozenset[int]):
        self.text = TextStream(tokenizer, req.ids, req.stop)
        self.eos_ids = eos_ids
        self.max_new_tokens = req.max_new_tokens
        self.out: list[int] = []
        self.finish: str | None = None

    def push(self, tokens) -> Iterator[str]:
        for t in tokens:
            if t in self.eos_ids:
                self.finish = "stop"
                return
            self.out.append(t)
            delta = self.text.push(t)
            if delta:
                yield delta
            if self.text.stopped:
                self.finish = "stop"
                return
            if len(self.out) >= self.max_new_tokens:
                self.finish = "length"
                return

    def tail(self) -> str:
        """What the detokenizer held back (a character's first bytes), once the request ends."""
        return self.text.finish()


def finish_stats(stats: GenerationStats, n_out: int, t0: float, t_first: float, gov: Governor | None,
                 mark) -> GenerationStats:
    """The stats a request ends with (both engines): totals, rates, energy per token."""
    now = time.perf_counter()
    stats.new_tokens = n_out
    stats.total_s = now - t0
    if stats.drafted:
        stats.acceptance_rate = stats.accepted / stats.drafted
    if stats.target_passes:
        stats.tokens_per_pass = n_out / stats.target_passes
    if stats.rounds:
        stats.k_mean = stats.drafted / stats.rounds
    if n_out > 1 and t_first and now > t_first:
        stats.decode_tokens_per_second = (n_out - 1) / (now - t_first)
    if mark is not None and gov is not None:
        try:
            stats.energy_j_per_token = gov.j_per_token_since(mark)
        except Exception:  # noqa: BLE001 - a sensor read failing must not fail the request
            stats.energy_j_per_token = None
    return stats


def decode(parts: Parts, req: Request, drafter: Drafter, k_cap: int,
           cache: PrefixCache) -> Generator[str, None, GenerationResult]:
    t0 = time.perf_counter()
    target, usable, params, gov = parts.target, parts.usable, req.params, parts.governor
    rng = make_rng(params.seed)
    stats = GenerationStats(prompt_tokens=len(req.ids), drafter=req.draft, tree=req.tree)
    if parts.tree is not None:
        parts.tree.begin()
    mark = gov.mark() if gov is not None else None

    # prefill only what the cache does not already hold (at least the last prompt token)
    reuse = min(common_prefix(cache.tokens, req.ids), len(req.ids) - 1, target.length)
    stats.cached_tokens = reuse
    target.rewind(reuse)
    ctx = list(req.ids)
    cache.tokens = ctx  # the target cache holds ctx[:target.length] from here on
    if req.cancel():
        return GenerationResult("", [], "cancelled", finish_stats(stats, 0, t0, t0, gov, mark))
    row = None
    t_read = time.perf_counter()
    for i in range(reuse, len(ctx), parts.prefill_chunk):
        row = target.step(ctx[i : i + parts.prefill_chunk], 1)[0]
    stats.prefill_s = time.perf_counter() - t_read
    stats.target_passes = 1
    drafter.begin(ctx)
    if k_cap > 0:
        drafter.prefill(ctx)  # what a drafter wants before decoding (the draft model: nothing by default)
    first = first_token(row, params, usable, rng, req.constraint)
    ctx.append(first)
    t_first = time.perf_counter()
    stats.ttft_s = t_first - t0

    em = Emitter(parts.tokenizer, req, parts.eos_ids)
    one = OneSlot(target)  # the batch of one (engine/round.py)
    cond = Conditions(usable, gov, parts.tree)
    seq = Seq(0, ctx, drafter, parts.free_drafter, 0, params, rng, stats, fixed_k=req.k is not None, tree=req.tree,
              constraint=req.constraint)
    finish = None
    pending = [first]
    try:
        while True:
            yield from em.push(pending)  # this round's tokens, until a stop condition hits
            finish = em.finish
            if finish:
                break
            if req.cancel():
                finish = "cancelled"
                break
            free = target.max_len - target.length  # the newest token needs a slot, proposals one each
            if free < 1:
                finish = "cache_full"
                break
            k = min(k_cap, free - 1, req.max_new_tokens - len(em.out) - 1)
            seq.k = k
            (r,) = run_round(one, [seq], cond)
            ctx.extend(r.tokens)
            pending = r.tokens
    finally:
        if parts.on_end is not None:  # also when the stream is closed early: ctx is final text
            parts.on_end(ctx)
    tail = em.tail()
    if tail:
        yield tail
    if parts.tree is not None:
        ts = parts.tree.stats
        stats.tree_rounds, stats.tree_nodes, stats.tree_off_chain = ts.rounds, ts.nodes, ts.off_chain
        stats.tree_shapes, stats.accepted_depth = dict(ts.shapes), dict(ts.accepted_depth)
    return GenerationResult(em.text.text, em.out, finish, finish_stats(stats, len(em.out), t0, t_first, gov, mark))
