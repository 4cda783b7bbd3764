"""Drafters propose the next few tokens cheaply; the target checks them all in one pass.

- `NoDrafter`     (base.py)   proposes nothing: plain target decoding through the same loop.
- `NgramDrafter`  (ngram.py)  prompt lookup; costs no model step at all.
- `ModelDrafter`  (model.py)  the small draft model on its own KV cache, adaptive from its confidence.
- `SuffixDrafter` (suffix.py) the suffix index (suffix_index.py) over this and earlier requests.
- `RecycleDrafter`(recycle.py) the target's own top candidates per token, kept from verify rows.
- `HeadsDrafter` (heads.py)  draft heads trained at export, over the target's own hidden state.
- `AutoDrafter`   (auto.py)   per round, the source (or none) promising the most tokens per second.

The interface they all implement is `base.Drafter` (a Protocol); the engine uses nothing else.
"""
from ..core.proposal import EMPTY, Proposal, common_prefix
from .auto import AutoDrafter
from .base import Beta, Drafter, DrafterBase, NoDrafter, Quote
from .costed import CostedDrafter
from .model import ModelDrafter
from .ngram import NgramDrafter, ngram_lookup, ngram_match
from .recycle import RecycleDrafter
from .suffix import SuffixDrafter
from .suffix_index import SuffixIndex

__all__ = ["EMPTY", "AutoDrafter", "Beta", "CostedDrafter", "Drafter", "DrafterBase", "ModelDrafter", "NgramDrafter", "NoDrafter",
           "Proposal", "RecycleDrafter", "SuffixDrafter", "SuffixIndex", "Quote", "common_prefix", "ngram_lookup", "ngram_match"]
