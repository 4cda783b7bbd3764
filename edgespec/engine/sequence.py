"""One request's life in one cache slot: the engine (batch.py) drives one Sequence per slot.

    seq = Sequence(req, runner, cached, drafting, vocab, governor)  # prefix reuse: the slot rewound
    while not seq.decoding:
        deltas = seq.prefill(chunk)        # a chunk of the prompt; after the last, the first token's text
    while seq.running():                   # asked after delivering the deltas: a stop, cancel, a full cache
        seq.next_k()                       # the round's proposal cap (seq.part.k)
        (r,) = run_round(target, [seq.part], cond)   # engine/round.py: the engine runs every part at once
        deltas = seq.take(r)               # the round's tokens as text, up to a stop condition
    tail, result = seq.tail(), seq.result()          # what the detokenizer held back; the final stats

In order: prefix reuse (the slot's cache holds `cached`; the request rewinds to the longest common
prefix, at least one prompt token left to read, and prefills only the rest: rewinding is exact, so
reuse never changes the output); the governor's mark (energy per token over this request); the
prompt read in chunks; at its end the drafters begin (the drafter, and the free fallback when it
is a drafter of its own), the drafter's prefill, and the first token; then rounds, each with the
next k (the cap, the cache's free rows and max_new_tokens), until a stop condition: EOS, a stop
string (also split across tokens), max_new_tokens, `cancel`, or a full cache; the final stats.

What is the engine's is there (batch.py): which slot a request takes and when its chunks run, the
pinned prefix, the tree verifier, what the drafters learn when a request ends.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol, Sequence as Seq_

from ..core.detokenize import TextStream
from ..core.proposal import common_prefix
from ..core.sampling import make_rng
from ..core.speculative import Round, first_token
from ..drafters import modes
from ..drafters.base import Session
from .requests import Request, Vocabulary
from .results import GenerationResult, GenerationStats
from .round import Governor, Seq
from .structured import tool_calls


class CacheSlot(Protocol):
    """The target's cache slot a request runs in: one slot of the target's ModelRunner as one
    sequence (core/slot.Slot)."""

    max_len: int

    @property
    def length(self) -> int: ...

    def step(self, tokens: Seq_[int], n_logits: int = 1): ...  # -> [n_logits, V]

    def rewind(self, length: int) -> None: ...


@dataclass
class PrefixCache:
    """The tokens whose K/V a slot's cache holds (a prefix of this list: the slot's length says how much)."""

    tokens: list[int] = field(default_factory=list)

    def clear(self) -> None:
        self.tokens = []


@dataclass
class Drafting:
    """What a request drafts with (its engine's drafters, built by drafters/modes.py)."""

    drafter: Session  # under a grammar, already wrapped (drafters/grammar.with_grammar)
    fallback: Session  # what a "free drafts only" limit drafts with for a drafter that uses a model
    k_cap: int  # most proposals a round (0: the target alone)


class Emitter:
    """The stop/emit step: a round's tokens become text deltas until EOS, a stop string (also split
    across tokens) or max_new_tokens. After `push`, `finish` is "stop" | "length" when one of them
    hit (else None) and `out` holds the tokens emitted (not the EOS)."""

    def __init__(self, tokenizer, req: Request, eos_ids: frozenset[int]):
        self.text = TextStream(tokenizer, req.ids, req.stop)
        self.eos_ids = eos_ids
        self.max_new_tokens = req.max_new_tokens
        self.out: list[int] = []
        self.finish: str | None = None

    def push(self, tokens) -> list[str]:
        deltas = []
        for t in tokens:
            if t in self.eos_ids:
                self.finish = "stop"
                break
            self.out.append(t)
            delta = self.text.push(t)
            if delta:
                deltas.append(delta)
            if self.text.stopped:
                self.finish = "stop"
                break
            if len(self.out) >= self.max_new_tokens:
                self.finish = "length"
                break
        return deltas


class Sequence:
    """One request in its cache slot; see the module docstring. `part` is its part in every round
    (engine/round.Seq: its context, drafters, k, RNG and stats)."""

    def __init__(self, req: Request, runner: CacheSlot, cached: Seq_[int], drafting: Drafting, vocab: Vocabulary,
                 governor: Governor | None = None, *, slot: int = 0, tree=None, t0: float | None = None):
        """cached: the tokens whose K/V the slot holds (a prefix of them: runner.length); tree: the
        slot's TreeVerifier (engine/tree_round.py) when the request gets one (batch.py: with one slot
        every request, with several tree="on" ones), which may verify its rounds as trees (None:
        chains); t0: when the request arrived (default: now)."""
        self.req, self.runner, self.vocab, self.governor, self.tree = req, runner, vocab, governor, tree
        self.t0 = time.perf_counter() if t0 is None else t0
        self.stats = GenerationStats(prompt_tokens=len(req.ids), drafter=req.draft,
                                     tree=req.tree if tree is not None else "off")
        if tree is not None:
            tree.begin()
        self.mark = governor.mark() if governor is not None else None
        reuse = min(common_prefix(cached, req.ids), len(req.ids) - 1, runner.length)
        self.stats.cached_tokens = reuse
        runner.rewind(reuse)
        self.ctx = list(req.ids)  # the slot holds ctx[:runner.length] from here on
        self.filled = reuse  # prompt tokens in the slot's cache
        self.k_cap = drafting.k_cap
        self.part = Seq(slot, self.ctx, drafting.drafter, drafting.fallback, 0, req.params, make_rng(req.params.seed),
                        self.stats, fixed_k=req.k is not None, tree=self.stats.tree, constraint=req.constraint)
        self.emit: Emitter | None = None  # from the first token on
        self.t_first = 0.0
        self.finish: str | None = None  # "stop" | "length" | "cache_full" | "cancelled" once it ended
        self.batch_sizes: list[int] = []  # sequences verified with it, per round

    @property
    def decoding(self) -> bool:
        """The prompt is read and the first token chosen."""
        return self.emit is not None

    def prefill(self, chunk: int) -> list[str]:
        """Reads the next chunk (at most `chunk` tokens) of the prompt into the slot; after the last,
        chooses the first token and returns its text (none while the prompt is still being read)."""
        end = min(len(self.ctx), self.filled + chunk)
        t = time.perf_counter()
        row = self.runner.step(self.ctx[self.filled : end], 1)[0]
        self.stats.prefill_s += time.perf_counter() - t
        self.filled = end
        if end < len(self.ctx):
            return []
        self.stats.target_passes = 1
        d, fallback = self.part.drafter, self.part.fallback
        d.begin(self.ctx)
        # the fallback begins too when it is a drafter of its own: one a mode builds over it (auto
        # over the suffix index) begins it already, and twice would fade its estimates twice
        if d.uses_model and fallback is not d and modes.FALLBACK not in modes.built_over(self.req.draft):
            fallback.begin(self.ctx)
        if self.k_cap > 0:
            d.prefill(self.ctx)  # what a drafter wants before decoding (the draft model: nothing by default)
        first = first_token(row, self.req.params, self.vocab.usable, self.part.rng, self.req.constraint)
        self.ctx.append(first)
        self.t_first = time.perf_counter()
        self.stats.ttft_s = self.t_first - self.t0
        self.emit = Emitter(self.vocab.tokenizer, self.req, self.vocab.eos_ids)
        return self.emit.push([first])

    def next_k(self) -> None:
        """This round's proposal cap: the drafting cap, the cache's free rows (the newest token
        needs one, each proposal one) and the tokens max_new_tokens still allows."""
        free = self.runner.max_len - self.runner.length
        self.part.k = min(self.k_cap, free - 1, self.req.max_new_tokens - len(self.emit.out) - 1)

    def take(self, r: Round) -> list[str]:
        """A round's tokens into the context and through the stop/emit step."""
        self.ctx.extend(r.tokens)
        return self.emit.push(r.tokens)

    def running(self) -> bool:
        """Asked once the deltas so far were delivered: whether another round runs. Else `finish`
        says why: the stop/emit step's stop, `cancel`, or a full cache."""
        if self.emit.finish:
            self.stop(self.emit.finish)
        elif self.req.cancel():
            self.stop("cancelled")
        elif self.runner.max_len - self.runner.length < 1:  # the newest token needs a position
            self.stop("cache_full")
        return self.finish is None

    def stop(self, finish: str) -> None:
        """Ends the request (the first reason given stays)."""
        if self.finish is None:
            self.finish = finish

    def tail(self) -> str:
        """What the detokenizer held back (a character's first bytes), once the request ends."""
        return self.emit.text.finish() if self.emit is not None else ""

    def result(self) -> GenerationResult:
        """The request's result: its text, tokens, finish and final stats."""
        out = self.emit.out if self.emit is not None else []
        text = self.emit.text.text if self.emit is not None else ""
        st = finish_stats(self.stats, len(out), self.t0, self.t_first, self.governor, self.mark)
        if self.batch_sizes:
            st.batch_size_mean = sum(self.batch_sizes) / len(self.batch_sizes)
        if self.tree is not None:
            ts = self.tree.stats
            st.tree_rounds, st.tree_nodes, st.tree_off_chain = ts.rounds, ts.nodes, ts.off_chain
            st.tree_shapes, st.accepted_depth = dict(ts.shapes), dict(ts.accepted_depth)
        c = self.req.constraint
        st.forced_tokens = c.forced_count if c is not None else 0
        assert self.finish is not None, "result() of a request still running"
        return GenerationResult(text, list(out), self.finish, st,
                                tool_calls(text, self.req.structured, self.vocab.grammars))


def unstarted(req: Request, vocab: Vocabulary, t0: float) -> GenerationResult:
    """The result of a request cancelled before it took a cache slot (still waiting for one)."""
    st = finish_stats(GenerationStats(prompt_tokens=len(req.ids), drafter=req.draft), 0, t0, 0.0, None, None)
    return GenerationResult("", [], "cancelled", st, tool_calls("", req.structured, vocab.grammars))


def finish_stats(stats: GenerationStats, n_out: int, t0: float, t_first: float, gov: Governor | None,
                 mark) -> GenerationStats:
    """The stats a request ends with: totals, rates, energy per token."""
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
