"""Self-speculative drafting (`draft="self"`): the target with some decoder layers skipped drafts for
itself. No second model, no second tokenizer, no second copy of the weights (core/shared_weights.py;
the skipped graph runs on the target's own cache slot: core/slot.py's SkipGraph, a slot of the
self-draft's runner, so the engine's round drafts for all its slots in one pass a step:
engine/draft_batch.py).

The layers to skip: the exporter's measured choice, stored in the manifest
(`models.target.self_draft = {"skip": [...], "acceptance": ..., ...}`, export/edgespec_export/self_search.py),
or, for a bundle exported before that field existed, `default_skip` (docs/runtime.md).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Sequence

from ..core.costmodel import CostModel
from ..core.slot import SkipGraph
from ..errors import DraftUnavailable
from ..models.manifest import ModelFacts
from .model import ModelDrafter

log = logging.getLogger("edgespec.drafters.self")


def default_skip(layers: int) -> list[int]:
    """The skip set of a bundle whose manifest has none: every other layer of the middle half
    (layers L/4 .. 3L/4, starting at L/4), never layer 0 nor the last layer. About a quarter of
    the layers: the middle layers change the residual stream least (SWIFT, LayerSkip), and
    alternating keeps no long run of missing layers. 2..3-layer models skip layer 1."""
    if layers < 2:
        raise DraftUnavailable(f"a {layers}-layer model has no layer to skip: draft='self' needs 2 or more",
                               param="draft")
    lo, hi = max(1, layers // 4), min(layers - 1, (3 * layers) // 4)
    skip = list(range(lo, hi, 2))
    return skip or [1]


@dataclass
class SkipChoice:
    skip: list[int]
    source: str  # "manifest" (chosen by the exporter's search) or "default" (default_skip)
    info: dict = field(default_factory=dict)  # the manifest's record (acceptance, speed, ...)


def skip_for(facts: ModelFacts) -> SkipChoice:
    """The layers to skip for this target: the manifest's choice, else the documented default."""
    rec = getattr(facts, "self_draft", None)
    if isinstance(rec, dict) and rec.get("skip"):
        skip = [int(i) for i in rec["skip"]]
        if all(1 <= i < facts.layers for i in skip):
            return SkipChoice(sorted(set(skip)), "manifest", dict(rec))
        log.warning("manifest's self_draft.skip %s is out of range for %d layers: using the default", skip,
                    facts.layers)
    return SkipChoice(default_skip(facts.layers), "default")


class SelfDrafter(ModelDrafter):
    """ModelDrafter's adaptive drafting (stop when its own confidence says one more token does not
    pay) on the self-draft runner. Each proposal starts at the target's cache length and steps the
    newest token first: the target's cache already holds everything before it, for every layer the
    draft keeps, so there is no catch-up, no prefill and no rewind."""

    name = "self"

    def __init__(self, runner: SkipGraph, usable: int, costs: CostModel | None = None, *, adaptive: bool = True):
        super().__init__(runner, usable, costs, adaptive=adaptive)
        # a self-draft agrees with its target less than a good draft model: a lower prior
        for b in self.by_conf:
            b.a, b.b = b.a * 0.8, b.b + b.a * 0.2

    def catch_up(self, ctx) -> int:
        return 0  # it drafts on the target's own cache: nothing to feed first

    def begin(self, ctx) -> None:
        self.tokens = []  # no cache of its own to rewind

    def prefill(self, ctx) -> None:  # the target's prefill is the draft's
        return None

    def reset(self) -> None:
        self.tokens = []

    def _sync(self, ctx: Sequence[int]):  # a step plan, as ModelDrafter's (drafters/base.py)
        target = self.runner.target
        if target.length != len(ctx) - 1:
            raise RuntimeError(f"self-draft: the target cache holds {target.length} tokens, the context "
                               f"needs {len(ctx) - 1} (core/speculative.py's invariant broken)")
        self.runner.length = target.length
        self.tokens = list(ctx[:-1])
        row = (yield self.runner, [ctx[-1]], 1)[0]
        self.tokens.append(ctx[-1])
        self.last_sizes.append(1)
        return row

    def warmup(self) -> None:
        """Times its 1-token step (it never catches up, so no other size) a few times."""
        for _ in range(3):
            self.runner.rewind(0)
            self.runner.step([0], 1)
        self.reset()

    def feedback(self, proposal, accepted, valid_len) -> None:
        self.tokens = []  # the rows it wrote are the verify's now
        self._judge(proposal, accepted)
