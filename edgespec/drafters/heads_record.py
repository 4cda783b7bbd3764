"""Which heads drafter a bundle's heads record asks for (Medusa heads or the feature drafter), built
here, above both modules (heads.py holds their shared base, feature.py imports it)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..core.slot import Slot
from ..errors import DraftUnavailable
from .feature import FeatureDrafter
from .heads import ChainHeads, HeadsDrafter


def from_record(record: dict, root: Path, session, target: Slot, usable: int) -> ChainHeads:
    """The drafter for a bundle's heads record (Manifest.heads; its graph checked against it when the
    bundle was read, models/graphfacts.py heads_problems) and its graph's session (the engine opens
    it: engine/build.py load_heads_session): Medusa heads, or the feature drafter (feature.py) for
    method "feature". The export's held-out top-1 per head (chain position) is the acceptance it
    starts from."""
    if not target.has_hidden:
        raise DraftUnavailable("the target graph has no hidden_states output: re-export the bundle with this "
                               "edgespec and --heads", param="draft")
    vocab_map = np.load(Path(root) / record["vocab_map"], allow_pickle=False)
    training = record.get("training", {})
    chain = training.get("heldout_chain")
    if chain:  # the feature drafter's: P(position j right | 0..j-1 right), what a chain's verify sees
        priors = [c / p if p > 0 else 0.0 for c, p in zip(chain, [1.0, *chain[:-1]])]
    else:
        priors = training.get("heldout_top1", ())
    cls = FeatureDrafter if record["method"] == "feature" else HeadsDrafter
    return cls(target, session, vocab_map, usable, int(record["n_heads"]), priors=priors)
