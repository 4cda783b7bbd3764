"""The decode loop of one request: prefill what the cache lacks, then speculative rounds until a stop.

    decode(parts, req, drafter, k_cap, cache) -> generator of text deltas, returning GenerationResult

Stop conditions: EOS ids, stop strings (also when split across tokens), max_new_tokens, a full
cache, and `cancel` (checked before every target pass). Prefix reuse: `cache.tokens` is what the
target cache holds (a prefix of it); a request rewinds to the longest common prefix and prefills only
the rest. Rewinding is exact, so reuse never changes the output.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Callable, Generator, Protocol

from ..core.detokenize import TextStream
from ..core.proposal import common_prefix
from ..core.runner import ModelRunner
from ..core.sampling import choose, make_rng
from ..core.speculative import speculative_round
from ..drafters.base import Drafter
from ..errors import InvalidRequest
from .requests import Request
from .tree_round import TreeVerifier
from .results import GenerationResult, GenerationStats


class RoundLimits(Protocol):
    max_k: int | None  # cap on proposals per round (None: no cap)
    drafting: str  # "any" | "ngram" (free drafts only) | "none"
    pace_s: float  # pause after each round (0: none)


class Governor(Protocol):
    """What the loop asks of a power/thermal governor (edgespec.edge.governor.Governor is the real one)."""

    def limits(self) -> RoundLimits: ...

    def on_tokens(self, n: int) -> None: ...

    def mark(self): ...

    def j_per_token_since(self, mark) -> float | None: ...

    def close(self) -> None: ...


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


def pin_for_determinism(req: Request) -> Request:
    """What deterministic mode (the runners' `deterministic=True`, docs/runtime.md) changes in a
    request. Chains only: a tree's rows sit at other cache rows than the chain's and round
    differently. A sampled request runs without drafts: which tokens were proposed decides how its
    random draws are spent, and proposals depend on what earlier requests left (the suffix index)
    and on measured step times (adaptive k); without drafts a seed spends one draw per token and
    replays. Greedy requests keep their drafter: every token is the target's argmax whatever was
    proposed. Raises InvalidRequest for tree="on"."""
    if req.tree == "on":
        raise InvalidRequest("tree='on' is not possible in deterministic mode (tree rows round unlike chain "
                             "rows): use tree='auto' or 'off'", param="tree")
    return replace(req, tree="off", draft=req.draft if req.params.greedy else "none")


@dataclass
class PrefixCache:
    """The tokens whose K/V the target cache holds (a prefix of this list)."""

    tokens: list[int] = field(default_factory=list)

    def clear(self) -> None:
        self.tokens = []


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
        return _finish(gov, "", [], "cancelled", stats, t0, t0, mark)
    row = None
    t_read = time.perf_counter()
    for i in range(reuse, len(ctx), parts.prefill_chunk):
        row = target.step(ctx[i : i + parts.prefill_chunk], 1)[0]
    stats.prefill_s = time.perf_counter() - t_read
    stats.target_passes = 1
    drafter.begin(ctx)
    if k_cap > 0:
        drafter.prefill(ctx)  # what a drafter wants before decoding (the draft model: nothing by default)
    first = choose(row, params, usable, rng)
    ctx.append(first)
    t_first = time.perf_counter()
    stats.ttft_s = t_first - t0

    text = TextStream(parts.tokenizer, req.ids, req.stop)
    out: list[int] = []
    finish = None
    pending = [first]
    try:
        while True:
            for t in pending:  # emit this round's tokens until a stop condition hits
                if t in parts.eos_ids:
                    finish = "stop"
                    break
                out.append(t)
                delta = text.push(t)
                if delta:
                    yield delta
                if text.stopped:
                    finish = "stop"
                    break
                if len(out) >= req.max_new_tokens:
                    finish = "length"
                    break
            if finish:
                break
            if req.cancel():
                finish = "cancelled"
                break
            free = target.max_len - target.length  # the newest token needs a slot, proposals one each
            if free < 1:
                finish = "cache_full"
                break
            k = min(k_cap, free - 1, req.max_new_tokens - len(out) - 1)
            round_drafter, pace = drafter, 0.0
            if gov is not None:
                lim = gov.limits()
                if lim.max_k is not None:
                    k = min(k, lim.max_k)
                if lim.drafting == "none":
                    k = 0
                elif lim.drafting == "ngram" and drafter.uses_model:
                    round_drafter = parts.free_drafter
                pace = lim.pace_s
            if parts.tree is not None:  # a governor's fallback drafter runs chains
                tree_mode = req.tree if round_drafter is drafter else "off"
                r = parts.tree.round(target, round_drafter, ctx, max(0, k), params, rng, usable, tree_mode)
            else:
                r = speculative_round(target, round_drafter, ctx, max(0, k), params, rng, usable)
            ctx.extend(r.tokens)
            stats.target_passes += 1
            stats.rounds += 1
            stats.drafted += r.drafted
            stats.accepted += r.accepted
            stats.rounds_by_source[r.source] = stats.rounds_by_source.get(r.source, 0) + 1
            if r.accepted:
                stats.accepted_by_source[r.source] = stats.accepted_by_source.get(r.source, 0) + r.accepted
            if gov is not None:
                gov.on_tokens(len(r.tokens))
                if pace > 0:
                    time.sleep(pace)  # the governor's pacing: a deliberate pause, not a wait for anything
            pending = r.tokens
    finally:
        if parts.on_end is not None:  # also when the stream is closed early: ctx is final text
            parts.on_end(ctx)
    tail = text.finish()
    if tail:
        yield tail
    if parts.tree is not None:
        ts = parts.tree.stats
        stats.tree_rounds, stats.tree_nodes, stats.tree_off_chain = ts.rounds, ts.nodes, ts.off_chain
        stats.tree_shapes, stats.accepted_depth = dict(ts.shapes), dict(ts.accepted_depth)
    return _finish(gov, text.text, out, finish, stats, t0, t_first, mark)


def _finish(gov: Governor | None, text: str, out: list[int], finish: str, stats: GenerationStats,
            t0: float, t_first: float, mark) -> GenerationResult:
    now = time.perf_counter()
    stats.new_tokens = len(out)
    stats.total_s = now - t0
    if stats.drafted:
        stats.acceptance_rate = stats.accepted / stats.drafted
    if stats.target_passes:
        stats.tokens_per_pass = len(out) / stats.target_passes
    if stats.rounds:
        stats.k_mean = stats.drafted / stats.rounds
    if len(out) > 1 and now > t_first:
        stats.decode_tokens_per_second = (len(out) - 1) / (now - t_first)
    if mark is not None:
        try:
            stats.energy_j_per_token = gov.j_per_token_since(mark)
        except Exception:  # a sensor read failing must not fail the request
            stats.energy_j_per_token = None
    return GenerationResult(text, out, finish, stats)
