"""Drafters propose the next few tokens cheaply; the target checks them all in one pass.

- `NoDrafter`     (base.py)   proposes nothing: plain target decoding through the same loop.
- `NgramDrafter`  (ngram.py)  prompt lookup; costs no model step at all.
- `ModelDrafter`  (model.py)  the small draft model on its own KV cache, adaptive from its confidence.
- `SuffixDrafter` (suffix.py) the suffix index (suffix_index.py) over this and earlier requests.
- `RecycleDrafter`(recycle.py) the target's own top candidates per token, kept from verify rows.
- `SelfDrafter`   (self.py)   the target with layers skipped.
- `AutoDrafter`   (auto.py)   per round, the source (or none) promising the most tokens per second.

The interface they all implement is `base.Drafter` (a Protocol in two parts: the `Session` a request's
round drives, the `Learner` that carries across requests); the engine uses nothing else. Which
modes exist, and how the engine builds each, is the table in modes.py (one row per drafter).

The names below are imported on first use (PEP 562), so that reading the mode table (the CLI's help
texts) does not import numpy and every drafter.
"""
from __future__ import annotations

import importlib

_WHERE = {
    "EMPTY": "..core.proposal", "Proposal": "..core.proposal", "common_prefix": "..core.proposal",
    "AutoDrafter": ".auto", "Beta": ".base", "Drafter": ".base", "DrafterBase": ".base", "Session": ".base", "Learner": ".base", "NoDrafter": ".base",
    "Quote": ".base", "DraftCost": ".base", "ModelDrafter": ".model", "NgramDrafter": ".ngram",
    "ngram_lookup": ".ngram", "ngram_match": ".ngram", "RecycleDrafter": ".recycle", "SuffixDrafter": ".suffix",
    "SuffixIndex": ".suffix_index",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(where, __name__), name)
    globals()[name] = value
    return value
