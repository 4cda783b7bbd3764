"""The small draft model on its own in-place KV cache, drafting until its own confidence says one more
token is not worth its cost."""
from __future__ import annotations

from bisect import bisect_right
from typing import Sequence

import numpy as np

from ..core.costmodel import CostModel
from ..core.proposal import EMPTY, Proposal, common_prefix
from ..core.slot import Slot
from ..core.sampling import SamplingParams, probs, sample
from ..errors import InvalidRequest
from ..limits import PREFILL_CHUNK
from .base import NEW_REQUEST_KEEP, Beta, DraftCost, DrafterBase, StepPlan, drive

# Acceptance is learned per bin of the draft's own probability for the token it proposed: a
# confident draft is usually right, an unsure one usually wrong, and that is known *before* paying
# for the next draft step and the longer verify.
_CONF_EDGES = np.array([0.2, 0.4, 0.6, 0.75, 0.85, 0.92, 0.97, 0.99])
_CONF_BOUNDS = tuple(float(x) for x in _CONF_EDGES)  # the same, for bisect on one scalar
# each bin's middle (the ends: 0.1 and 0.995), where a bin's acceptance prior starts (the draft
# model's, and the draft heads' per head)
CONF_MIDS = tuple(float(m) for m in np.concatenate([[0.1], (_CONF_EDGES[:-1] + _CONF_EDGES[1:]) / 2, [0.995]]))
PRIOR_ACCEPTANCE = 0.6  # a draft's long-run acceptance before anything is known of the pair
# Most tokens a catch-up feeds the draft: a longer one (a long prompt, or a long run of rounds other
# sources drafted) starts its cache afresh on the last CATCH_UP_WINDOW tokens of the context. The draft
# then reads a window of the text, not all of it: its proposals may be a little worse, never wrong (the
# target verifies every one), and a 2,000-token prompt costs it 256 tokens of prefill, not 2,000
# (docs/drafting.md, "The draft model on a long prompt").
CATCH_UP_WINDOW = 256
# The draft's confidence for its greedy token is its softmax probability, 1 / sum(exp(x - best)). Logits
# more than CONF_WINDOW under the best add at most exp(-20) ~ 2e-9 each to that sum (3e-4 over 151,936
# rows), so only those within it are exponentiated: one comparison pass over the row, not an exp of it
CONF_WINDOW = 20.0
CONF_PRIOR_SCALE = 1.0  # a confidence bin's acceptance before evidence: this times the bin's middle
# A draft that does not draft costs nothing (the policy: ModelDrafter's docstring). Probes: the skipped
# rounds' target time pays for a probe's catch-up at this share (3 %: under the 5 % a mode may lose to
# the target alone); a probe reads at most PROBE_WINDOW tokens afresh, and the evidence before it is cut
# to Beta.fade's floor, one verdict's worth (PROBE_KEEP 0), so one probe's verdict decides.
PROBE_SHARE = 0.03
PROBE_WINDOW = 32
PROBE_KEEP = 0.0
# The skip gate drafts only for a promised gain of at least this over the target alone: acceptance and
# step costs are estimates (a warm-up's 2-token verify was 1.24x its 1-token step, the same step in a
# run 1.37x), and a round drafted for a promised 1 % loses a draft step whenever they are a little off.
# At the dev CPU's costs it asks ~0.51 acceptance of a 1-token chain where 0 asked ~0.44.
MODEL_MIN_GAIN = 0.05


def conf_bin(c: float) -> int:
    return bisect_right(_CONF_BOUNDS, c)


class ModelDrafter(DrafterBase):
    """The small draft model on its own in-place KV cache (a core/slot.Slot: in the engine, its request
    slot's slot of the draft model's runner, engine/draft_batch.py; else slot 0 of a runner of its own).

    Its cache holds a prefix of the context; `_sync` feeds whatever is missing in one step (the
    target's last token, or a whole new prompt), so rewinding after a rejection is free. A proposal
    is a step plan (drafters/base.py): `propose` drives it alone, the engine runs the plans of all
    its requests' drafters drafting in a round together (engine/draft_batch.py). With
    `adaptive`, it stops drafting as soon as its own confidence says one more token is not worth
    its cost.

    A draft that does not draft costs nothing. With `adaptive`, before it feeds its cache anything,
    each round asks whether drafting pays with the cache in step: the best chain of 1..k tokens at its
    per-round acceptance `rounds` (accepted tokens are hits; a rejection, or a round it synced and then
    withdrew, is a miss, as `auto` counts it), each costing a measured draft step plus the verify of
    j + 1 tokens, against the target alone's one-token step with MODEL_MIN_GAIN (5 %) to spare. When
    it does not pay, the round proposes nothing and the draft's cache is left as it is: no catch-up, no draft step; the text it missed is
    read later, in one step within its window, by the round that drafts again. It still learns: after
    enough skipped rounds that their target time times PROBE_SHARE (3 %) covers the measured catch-up
    step of at most PROBE_WINDOW (32) tokens, a round probes: it syncs and proposes one token at
    least, and the evidence before it is cut to one verdict's worth, so a probe whose token is
    accepted brings the draft back (0.5 then, over the ~0.4 a chain needs on the dev CPU) and one
    that is rejected keeps it out. On the dev CPU (draft step 0.3 of a target step, a 32-token draft
    step ~1.5) that is a probe every ~50 skipped rounds, costing ~3 % of their time plus the probe's
    one-token proposal (a 2-token verify instead of 1: ~0.1 step). Before, every round paid a
    catch-up and a draft step to decide, which on a loaded run was 945 one-token draft steps of 20 ms
    for rounds that proposed nothing (`model` at 0.58x the target alone). `auto` prices the draft
    itself and calls `propose_now`, which drafts without this gate."""

    name = "model"
    uses_model = True

    def __init__(self, runner: Slot, usable: int, costs: CostModel | None = None, *, adaptive: bool = True,
                 vocab_map: Sequence[int] | np.ndarray | None = None, eager_prefill: bool = False,
                 prior: float | None = None, window: int = CATCH_UP_WINDOW):
        self.costs = costs
        self.last_sizes: list[int] = []  # tokens per draft step the last proposal ran (catch-up first)
        self.runner = runner
        self.usable = usable  # the target's vocabulary: q rows are this long
        # A draft may score only a prefix of the vocabulary (a pruned lm_head, see docs/speed.md):
        # it then proposes only those ids, and q is zero past them, which keeps sampling exact.
        self.scored = min(usable, runner.vocab_size)
        # ... or any subset (`edgespec export --draft-vocab N`): logits row j scores token
        # vocab_map[j]; proposals come only from the kept ids and q is renormalised over them
        self.vocab_map = None if vocab_map is None else check_vocab_map(vocab_map, runner.vocab_size, usable)
        if self.vocab_map is not None:
            self.scored = runner.vocab_size
        # False: the prompt is fed when a round first uses the draft, after the first token (the
        # first token never waits for a drafter); True: with the target's prefill, in the TTFT
        self.eager_prefill = eager_prefill
        self.adaptive = adaptive and costs is not None
        self.tokens: list[int] = []  # exactly what the draft cache holds: ctx[start : start + len(tokens)]
        self.start = 0  # where in the context the cache begins (> 0 after a catch-up longer than the window)
        self.window = max(1, int(window))
        # tree verification (engine/tree_round.py, set_tree_width): with alts > 0 the next proposal
        # also records, per drafted position, the draft's next `alts` best tokens (Proposal.alts)
        self.alts = 0
        self._picked_row = 0  # the logits row of the last token _pick chose
        self.by_conf = [Beta(m * CONF_PRIOR_SCALE) for m in CONF_MIDS]
        # its long-run acceptance starts from the export's measured agreement of this pair when the
        # bundle records one (Manifest.draft_agreement), else from a middling 0.6
        self.mean = Beta(PRIOR_ACCEPTANCE if prior is None else prior, weight=8.0)
        # per-round acceptance for the skip gate: like `mean`, plus a miss for each withdrawn round
        self.rounds = Beta(PRIOR_ACCEPTANCE if prior is None else prior, weight=8.0)
        self.skipped = 0  # rounds skipped since it last synced

    # -- the interface ----------------------------------------------------------------------------
    def begin(self, ctx) -> None:
        self._rewind(self._held(ctx))
        # a new text may suit the draft better or worse than the last: the skip gate starts from the
        # earlier requests' per-round acceptance, weakened, so this request's own verdicts decide
        # within a few rounds (a 27-token translation after code replies drafted through half of it)
        self.rounds.fade(NEW_REQUEST_KEEP)

    def _held(self, ctx: Sequence[int]) -> int:
        """How many of its cache's tokens ctx still has where the cache has them (from `start`)."""
        n, s = len(self.tokens), self.start
        if n and len(ctx) >= s + n:
            part = ctx[s : s + n]
            if (part if isinstance(part, list) else list(part)) == self.tokens:  # the usual case, at list speed
                return n
        return common_prefix(self.tokens, ctx[s:]) if len(ctx) > s else 0

    def _rewind(self, n: int) -> None:
        """Keeps the cache's first n tokens; an empty cache starts at the context's beginning again."""
        self.runner.rewind(n)
        del self.tokens[n:]
        if n == 0:
            self.start = 0

    def prefill(self, ctx: Sequence[int]) -> None:
        """With eager_prefill, feeds the prompt now (with the target's prefill: in the time to first
        token). By default it does nothing: `_sync` feeds the prompt on the first round that uses
        the draft, so a request whose rounds never need it never pays for it, and the first token
        never waits for it."""
        if self.eager_prefill and len(ctx) <= self.runner.max_len:
            drive(self._sync(ctx))

    def reset(self) -> None:
        self.runner.reset()
        self.tokens.clear()
        self.start = 0

    def stats(self) -> dict:
        """Its acceptance per drafted token, per round (withdrawn rounds count as misses: the skip
        gate's figure) and per confidence bin."""
        return {"acceptance": self.mean.mean, "round_acceptance": self.rounds.mean,
                "acceptance_by_confidence": [b.mean for b in self.by_conf]}

    def set_adaptive(self, on: bool) -> None:
        self.adaptive = on and self.costs is not None

    def set_tree_width(self, width: int) -> None:
        self.alts = max(0, width - 1)

    def warmup(self) -> None:
        """Times 1- and 2-token draft steps twice each (the first run of a shape pays one-off
        allocations), so its cost is this device's from the first round; leaves its cache empty."""
        for s in (1, 2):
            for _ in range(2):
                self.runner.rewind(0)
                self.runner.step([0] * s, 1)
        self.reset()

    def acceptance(self, conf: float) -> float:
        return self.by_conf[conf_bin(conf)].mean

    def catch_up(self, ctx: Sequence[int]) -> int:
        """Tokens its first draft step of a round must feed: what of ctx its cache lacks, at most the
        window (a longer catch-up starts the cache afresh on the window's tokens)."""
        held = self._held(ctx)
        return min(len(ctx) - (self.start + held if held else 0), self.window)

    def pays(self, k: int) -> bool:
        """Whether drafting 1..k tokens beats the target alone with the cache in step, at the
        per-round acceptance by at least MODEL_MIN_GAIN: the skip gate's test, a few multiplications,
        no model step."""
        return self.costs.best_k(self.rounds.mean, k, min_gain=MODEL_MIN_GAIN)[0] > 0

    def probe_due(self, ctx: Sequence[int]) -> bool:
        """Whether the rounds skipped since it last synced have earned a probe: their target time
        times PROBE_SHARE covers the probe's catch-up step (at most PROBE_WINDOW tokens)."""
        catch = self.costs.draft_step(max(1, min(self.catch_up(ctx), PROBE_WINDOW)))
        return self.skipped * self.costs.verify(1) * PROBE_SHARE >= catch

    def cost(self, ctx: Sequence[int]) -> DraftCost | None:
        """Its measured draft steps: the first one feeds whatever of ctx its cache lacks."""
        if self.costs is None:
            return None
        one = self.costs.draft_step()
        pending = self.catch_up(ctx)
        return DraftCost(self.costs.draft_step(pending) if pending > 1 else one, one, self.mean.mean)

    # -- drafting ---------------------------------------------------------------------------------
    def _sync(self, ctx: Sequence[int], window: int | None = None):
        """A plan that makes the draft cache hold ctx (its last `window` tokens at least; default
        self.window) and returns the logits row predicting the next token. Shapes: the fed chunks
        [<= PREFILL_CHUNK] -> row [vocab rows]."""
        window = self.window if window is None else window
        n = min(self._held(ctx), len(ctx) - self.start - 1)
        if n <= 0:  # nothing of the cache is of use: it starts at the context's beginning again
            self.start, n = 0, 0
        if len(ctx) - self.start - n > window:  # cheaper to read the window's tokens afresh
            self.start, n = len(ctx) - window, 0
        self.runner.rewind(n)
        del self.tokens[n:]
        row = None
        end = len(ctx) - self.start
        while n < end:
            chunk = list(ctx[self.start + n : self.start + min(n + PREFILL_CHUNK, end)])
            row = (yield self.runner, chunk, 1)[0]
            self.last_sizes.append(len(chunk))
            self.tokens.extend(chunk)
            n += len(chunk)
        return row

    def propose(self, ctx, k, params, rng) -> Proposal:
        return drive(self.propose_steps(ctx, k, params, rng))

    def propose_now(self, ctx, k, params, rng) -> Proposal:
        return drive(self.propose_steps(ctx, k, params, rng, now=True))

    def propose_steps(self, ctx, k, params, rng, now: bool = False) -> StepPlan:
        """This round's proposal, or EMPTY without a model step when drafting does not pay (the
        class docstring's skip gate; adaptive only). now: drafts whatever the skip gate says
        (`auto` priced the round itself)."""
        self.last_sizes = []
        if k <= 0 or len(ctx) + k - 1 > self.runner.max_len:
            return EMPTY
        if now or not self.adaptive or self.pays(k):
            return (yield from self._draft(ctx, k, params, rng, None, probe=False))
        if not self.probe_due(ctx):
            self.skipped += 1
            return EMPTY
        # a probe: its verdict outweighs the misses before it, in the gate's estimate and in the
        # confidence bins (which learn only from proposals: without it they would keep it out for good)
        for b in (self.rounds, *self.by_conf):
            b.fade(PROBE_KEEP)
        window = PROBE_WINDOW if self.catch_up(ctx) > PROBE_WINDOW else None
        return (yield from self._draft(ctx, k, params, rng, window, probe=True))

    def _draft(self, ctx, k, params, rng, window: int | None, *, probe: bool) -> StepPlan:
        """A plan that syncs (reading at most `window` tokens afresh) and drafts; a probe proposes
        one token at least, whatever its confidence says: it is there to be judged."""
        self.skipped = 0
        alts: list[list[tuple[int, float]]] = []
        row = yield from (self._sync(ctx) if window is None else self._sync(ctx, window))
        tokens: list[int] = []
        confs: list[float] = []
        qs: list[np.ndarray] = []
        # greedy drafting under the round's figure of merit: expected tokens / seconds
        d = self.costs.draft_step() if self.adaptive else 0.0
        p_all, e_tok, best_j, best_rate = 1.0, 1.0, 0, 0.0
        if self.adaptive:
            best_rate = 1.0 / (d + self.costs.verify(1))  # submitting nothing after one draft step
        for j in range(k):
            t, c, q = self._pick(row, params, rng)
            if self.alts > 0:  # siblings by logits row; a pruned head's rows map back to token ids
                ups = runner_ups(row[: self.scored], self._picked_row, self.alts)
                m = self.vocab_map
                alts.append(ups if m is None else [(int(m[i]), pr) for i, pr in ups])
            if q is not None:
                qs.append(q)
            tokens.append(t)
            confs.append(c)
            if not self.adaptive:
                if j + 1 < k:
                    row = yield from self._step(t)
                continue
            p_all *= self.acceptance(c)
            e_tok += p_all
            spent = (j + 1) * d
            rate = e_tok / (spent + self.costs.verify(j + 2))
            if rate > best_rate:
                best_j, best_rate = j + 1, rate
            if j + 1 == k:
                break
            # one more draft step pays if the next token's expected value beats its cost
            more = (e_tok + p_all * self.mean.mean) / (spent + d + self.costs.verify(j + 3))
            if more <= best_rate:
                break
            row = yield from self._step(t)
        if self.adaptive:
            best_j = max(best_j, 1) if probe else best_j
            del tokens[best_j:], confs[best_j:], qs[best_j:]
        if not tokens:
            self.rounds.add(0, 1)  # withdrawn (or nothing drafted): its steps bought no token
            return EMPTY
        # per-token acceptance estimates (a batched round's width, a tree's pricing read them) and
        # the seconds its draft steps cost (a tree's pricing)
        return Proposal(tokens, np.stack(qs) if qs else None, self.name, confs,
                        accept=[self.acceptance(c) for c in confs], alts=alts[: len(tokens)],
                        draft_s=self.costs.draft_steps(self.last_sizes) if self.costs is not None else 0.0)

    def _pick(self, row: np.ndarray, params: SamplingParams, rng) -> tuple[int, float, np.ndarray | None]:
        t, c, q, self._picked_row = pick(row, params, rng, self.scored, self.usable, self.vocab_map)
        return t, c, q

    def _step(self, t: int):
        """A plan of one draft step on token t; returns the row predicting the next token."""
        row = (yield self.runner, [t], 1)[0]
        self.tokens.append(t)
        self.last_sizes.append(1)
        return row

    def feedback(self, proposal, accepted, valid_len) -> None:
        if valid_len - self.start < len(self.tokens):
            self._rewind(max(0, valid_len - self.start))
        self._judge(proposal, accepted)

    def _judge(self, proposal, accepted: int) -> None:
        """Scores this drafter's own proposal: acceptance by confidence bin, and overall."""
        if proposal.source != self.name or not proposal.tokens:
            return
        judged = proposal.conf[: accepted + 1]  # tokens after the first rejection were never judged
        self.rounds.add(accepted, 0 if accepted == len(proposal.tokens) else 1)
        for i, c in enumerate(judged):
            ok = i < accepted
            self.by_conf[conf_bin(c)].add(ok, not ok)
            self.mean.add(ok, not ok)


def pick(row: np.ndarray, params: SamplingParams, rng, scored: int, usable: int,
         vocab_map: np.ndarray | None) -> tuple[int, float, np.ndarray | None, int]:
    """A drafter's token from its logits row (its first `scored` entries), its probability for it,
    (sampling only) the distribution q it was drawn from, [usable], and the row index picked.
    vocab_map: row j scores token vocab_map[j] (a pruned head); q is zero elsewhere, renormalised
    over the scored rows, which keeps rejection sampling exact."""
    m = vocab_map
    if params.greedy:
        x = row[:scored]
        j = int(np.argmax(x))
        return (j if m is None else int(m[j])), greedy_confidence(x, j), None, j
    q = probs(row, params, scored)  # over the scored rows only: renormalised there
    j = sample(q, rng)
    c = float(q[j])
    if m is not None:
        full = np.zeros(usable)
        full[m] = q
        return int(m[j]), c, full, j
    if scored < usable:
        q = np.concatenate([q, np.zeros(usable - scored)])
    return j, c, q, j


def greedy_confidence(x: np.ndarray, j: int) -> float:
    """The softmax probability of logits row x's best entry j, from the entries within CONF_WINDOW of
    it (the others change it by less than 2e-9 each): x [rows] float."""
    top = x[j]
    near = np.compress(np.greater(x, top - CONF_WINDOW), x)  # a comparison pass; the exp runs on a few
    return float(1.0 / np.exp(near - top).sum())


def runner_ups(row: np.ndarray, chosen: int, n: int) -> list[tuple[int, float]]:
    """The n most likely tokens of a logits row other than `chosen`, with their (softmax)
    probabilities, most likely first: tree verification's siblings of a drafted token."""
    m = min(n + 1, row.shape[0])
    top = np.argpartition(row, -m)[-m:]
    top = top[np.argsort(row[top])[::-1]]
    z = np.exp(row - row[top[0]]).sum()
    return [(int(i), float(np.exp(row[i] - row[top[0]]) / z)) for i in top if i != chosen][:n]


def check_vocab_map(vocab_map, rows: int, usable: int) -> np.ndarray:
    """A pruned draft's row -> token id map, checked: one distinct usable id per logits row."""
    m = np.asarray(vocab_map)
    if m.ndim != 1 or m.shape[0] != rows or not np.issubdtype(m.dtype, np.integer):
        raise InvalidRequest(f"draft vocabulary map: expected {rows} integer ids (one per logits row), "
                             f"got shape {m.shape} of {m.dtype}", param="draft")
    m = m.astype(np.int64)
    if rows and (m.min() < 0 or m.max() >= usable):
        raise InvalidRequest(f"draft vocabulary map: ids must be in [0, {usable}), got {m.min()}..{m.max()}",
                             param="draft")
    if np.unique(m).size != rows:
        raise InvalidRequest("draft vocabulary map: an id appears twice", param="draft")
    return m
