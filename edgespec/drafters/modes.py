"""The drafting modes, one row each: what a `draft` setting may name, and everything the layers above
need to know about it. Validation (engine settings, requests, the server), the CLI's help texts and
the bench's columns all read this table; every mode runs at every --parallel; the engine builds its drafters
through each row's `build`: the rows of each request's mode, per request (`build_all` over
`request_rows`, engine/batch_drafters.py; the `per_slot` rows once per slot). A new drafter is its
module plus one row here.

This module imports nothing heavy at import time (the CLI reads it to write `--help`): each `build`
imports its drafter when an engine is opened.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..errors import InvalidRequest
from ..limits import DRAFT_MODES


@dataclass
class Kit:
    """What the engine lends the drafters it builds for a request (engine/batch_drafters.py)."""

    costs: Any  # core.costmodel.CostModel over the target's (and draft's) measured step times
    usable: int  # ids >= usable are never proposed
    target: Any = None  # the target's core/slot.Slot (a drafter reading the target's own outputs)
    target_times: Any = None  # the target's StepTimes (a self-draft prices itself against them)
    runners: dict[str, Any] | None = None  # "draft": the draft model's runner, "self": the self-draft's
    suffix_capacity: int = 1 << 20
    vocab_map: Any = None  # the pruned draft's logits row -> token id map (`export --draft-vocab`)
    bundle: Any = None  # models.bundle.Bundle (its manifest's records: the draft heads')
    sources: list | None = None  # the built drafters `auto` chooses between (by auto_rank), for its row's build
    shared: Any = None  # the finished requests' SuffixIndex, read and never written
    recycle_table: Any = None  # the engine's recycle table, one for every request
    docs: Any = None  # docs.answer.Docs: the documents an engine answers from (the docs drafter's text)
    docs_store: Any = None  # the engine's index over them (drafters/docs.DocsStore), one for every request

    def runner(self, name: str):
        return (self.runners or {}).get(name)


@dataclass(frozen=True)
class DraftMode:
    name: str
    help: str  # one phrase for --help texts and docs
    runner: str | None = None  # the runner it drafts with ("draft": the draft model, "self": the
    # self-draft, "heads": the heads' session, "docs": an engine's documents); without it loaded the
    # mode is unavailable. None: free
    loads: tuple[str, ...] = ()  # runners an engine opened with this default mode loads (when it can)
    fixed_k: bool = True  # the bench adds "mode k=N" columns for it (auto picks its k every round)
    auto_rank: int | None = None  # a source `auto` chooses between, by this order of preference
    build: Callable[[Kit], Any] | None = None  # the engine's drafter (None: nothing to build)
    chooses: bool = False  # its build chooses between the other rows' drafters (Kit.sources): built last
    fallback: bool = False  # the free drafter a limit that forbids model steps drafts with instead
    per_slot: bool = False  # the engine keeps its drafter with the slot across requests (its
    # cache, its calibration) instead of building one per request


def _ngram(kit: Kit):
    from .ngram import NgramDrafter

    return NgramDrafter(kit.costs)


def _suffix(kit: Kit):
    from .suffix import SuffixDrafter
    from .suffix_index import SuffixIndex

    return SuffixDrafter(SuffixIndex(kit.suffix_capacity), kit.costs, shared=kit.shared)


def _recycle(kit: Kit):
    from .recycle import RecycleDrafter

    if kit.usable is None:
        return None
    return RecycleDrafter(kit.usable, kit.costs, table=kit.recycle_table)


def _model(kit: Kit):
    from .model import ModelDrafter

    runner = kit.runner("draft")
    if runner is None:
        return None
    prior = kit.bundle.manifest.draft_agreement if kit.bundle is not None else None
    return ModelDrafter(runner, kit.usable, kit.costs, vocab_map=kit.vocab_map, prior=prior)


def _self(kit: Kit):
    from ..core.costmodel import CostModel
    from .self import SelfDrafter

    runner = kit.runner("self")
    return None if runner is None else SelfDrafter(runner, kit.usable, CostModel(kit.target_times, runner.times))


def _heads(kit: Kit):
    from .heads_record import from_record

    session = kit.runner("heads")
    if session is None:
        return None
    return from_record(kit.bundle.manifest.heads, kit.bundle.root, session, kit.target, kit.usable)


def _docs(kit: Kit):
    from .docs import DocsDrafter, DocsStore

    if kit.docs is None:
        return None
    return DocsDrafter(kit.docs_store if kit.docs_store is not None else DocsStore(kit.docs), kit.costs)


def _auto(kit: Kit):
    from .auto import AutoDrafter

    return AutoDrafter(kit.costs, list(kit.sources or ()))


def _grammar(kit: Kit):
    from .grammar import GrammarDrafter

    return GrammarDrafter(kit.costs)


def _none(kit: Kit):
    from .base import NoDrafter

    return NoDrafter()


# `auto` does not load the self-draft by itself: sharing the weights turns prepacking off, which slowed
# the target's own steps on the dev CPU (SmolLM2 fp32: 1-token step 20 -> 27 ms; docs/speed.md,
# "Self-speculative drafting"), a cost paid whether or not a round drafts. An engine opened with
# draft="self" has it as one more source of its `auto`.
MODES: tuple[DraftMode, ...] = (
    DraftMode("auto", "per round, whichever source (suffix index, draft model, heads) pays "
              "most by measured cost, or none", loads=("draft", "heads"), fixed_k=False, build=_auto,
              chooses=True),
    DraftMode("model", "the bundle's draft model", runner="draft", loads=("draft",), auto_rank=2,
              build=_model, per_slot=True),
    DraftMode("suffix", "the suffix index over this and earlier requests", auto_rank=0,
              build=_suffix, fallback=True),
    DraftMode("docs", "the venue's documents (an engine opened with --docs INDEX): an answer quoting any "
              "passage copies it", runner="docs", auto_rank=1, build=_docs),
    # not one of auto's sources: greedy, its first candidate is the token that followed the same token
    # last time, which the suffix index's lookups already hold. As a source of auto on the dev pair it
    # drafted 1, 5 and 7 rounds in three bench runs (at most 3 of 870 accepted tokens), while watching
    # every verified row costs ~0.2 ms per token (the bench's loop column: recycle 0.46 ms, target 0.27)
    DraftMode("recycle", "the target's own top candidates per token, recycled", build=_recycle,
              per_slot=True),
    DraftMode("ngram", "prompt lookup (n-gram)", build=_ngram),
    DraftMode("self", "the target with some layers skipped drafts for itself (a bundle exported with "
              "--self-draft)", runner="self", loads=("self",), auto_rank=3, build=_self, per_slot=True),
    DraftMode("heads", "draft heads over the target's hidden state (a bundle exported with --heads)",
              runner="heads", loads=("heads",), auto_rank=4, build=_heads, per_slot=True),
    DraftMode("grammar", "the tokens a request's JSON schema or grammar forces (free; proposes nothing "
              "without one)", auto_rank=5, build=_grammar),
    DraftMode("none", "the target alone", fixed_k=False, build=_none),
)
BY_NAME = {m.name: m for m in MODES}
NAMES = tuple(m.name for m in MODES)  # what a `draft` setting or request may name
if NAMES != DRAFT_MODES:  # the manifest reader checks `drafting.mode` against limits.DRAFT_MODES
    raise ImportError(f"drafters/modes.py rows {NAMES} differ from limits.DRAFT_MODES {DRAFT_MODES}: add the name there")
FALLBACK = next(m.name for m in MODES if m.fallback)


def _made(row: DraftMode, kit: Kit):
    return row.build(kit) if row.build is not None else None


def _ranked(rows) -> list[DraftMode]:
    return sorted((r for r in rows if r.auto_rank is not None), key=lambda r: r.auto_rank)


def build_all(kit: Kit, rows: tuple[DraftMode, ...] = MODES,
              make: Callable[[DraftMode, Kit], Any] | None = None) -> dict[str, Any]:
    """Every drafter of `rows` the table can build with what `kit` holds, by mode name: the rows
    that choose between others last, over the built drafters they rank (auto_rank). `make(row,
    kit)`: how a row's drafter is made (default: its build; the engine reuses what it keeps
    with a slot)."""
    built: dict[str, Any] = {}
    for row in sorted(rows, key=lambda r: r.chooses):
        if row.chooses:
            kit.sources = [built[r.name] for r in _ranked(rows) if r.name in built]
        d = (make or _made)(row, kit)
        if d is not None:
            built[row.name] = d
    return built


def request_rows(name: str) -> tuple[DraftMode, ...]:
    """The rows a request in mode `name` builds: its own and, for a row that chooses, the
    rows it ranks."""
    row = get(name)
    return (row, *(r for r in _ranked(MODES) if r is not row)) if row.chooses else (row,)


def built_over(name: str) -> set[str]:
    """The modes mode `name`'s drafter is, or is built over (auto: the sources it ranks)."""
    return {r.name for r in request_rows(name)}


def get(name) -> DraftMode:
    """The row for a mode name; anything else is an InvalidRequest listing the names."""
    row = BY_NAME.get(name) if isinstance(name, str) else None
    if row is None:
        raise InvalidRequest(f"unknown drafter {name!r}: choose one of {', '.join(NAMES)}", param="draft")
    return row


def help_text(default: str = "auto") -> str:
    """`--draft`'s help: every mode in one line."""
    return "; ".join(f"{m.name}{' (default)' if m.name == default else ''}: {m.help}" for m in MODES)
