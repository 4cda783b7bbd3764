"""Opening the target and its self-draft on shared weights (drafters/self.py, core/shared_weights.py,
core/slot.py's SkipGraph): the target as a ModelRunner of the engine's `parallel` slots, and the
layer-skipped session as a runner over the target's cache (`SelfPair.skips`, core/runner.py
ModelRunner.skip): slot b's self-draft is its slot b (`SelfPair.skip`), and the engine's round
drafts for every slot drafting with it in one pass of it (engine/draft_batch.py)."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from ..core.runner import ModelRunner
from ..core.shared_weights import SharedWeights
from ..core.slot import SkipGraph, Slot
from ..drafters.self import SkipChoice, skip_for
from ..errors import DraftUnavailable
from ..models.manifest import ModelFacts

log = logging.getLogger("edgespec.engine.selfdraft")


@dataclass
class SelfPair:
    target: Slot  # slot 0 of the target's runner
    runner: SkipGraph  # the self-draft on slot 0
    choice: SkipChoice
    weights: SharedWeights
    model: ModelRunner  # the target's runner, all its slots
    skips: ModelRunner  # the self-draft's runner over the target's cache, all its slots (model.skip)

    def skip(self, b: int) -> SkipGraph:
        """The self-draft on slot b's own buffers (slot 0's is `runner`)."""
        return self.skips.slot(b)


def open_pair(model_path: Path, facts: ModelFacts, max_len: int, choice: SkipChoice, *, providers=None,
              threads: int | None = None, shared_threads: bool = True, profile=None,
              deterministic: bool = False, slots: int = 1) -> SelfPair:
    """Creates the target's session and runner (`slots` cache slots) and the self-draft session on the
    same weights.

    Raises DraftUnavailable (with the reason) when the self-draft graph cannot be made: `onnx`
    missing, or a graph this edit does not understand."""
    try:
        import onnx  # noqa: F401
    except ImportError:
        raise DraftUnavailable("draft='self' builds its graph at load with the onnx package, which is not "
                               "installed: pip install onnx", param="draft") from None
    from ..edge.providers import create_session, use_shared_thread_pool
    from ..models.layer_skip import LayerSkipError, skip_layers

    weights = SharedWeights(model_path)
    try:
        dproto = skip_layers(weights.proto, choice.skip, facts.layers)
    except LayerSkipError as e:
        raise DraftUnavailable(f"draft='self' is not possible for this graph: {e}", param="draft") from None
    if shared_threads:
        shared_threads = use_shared_thread_pool(threads)
    kw = {} if shared_threads else {"spinning": False}
    # the target's graph as SharedWeights edited it (constant Transposes folded once), weights shared
    folder = model_path.parent
    tsess, device = create_session(weights.proto.SerializeToString(), providers=providers, threads=threads,
                                   profile=profile, shared_threads=shared_threads,
                                   configure=lambda so: weights.configure(so, folder=folder),
                                   flavor=facts.graph_flavor(), **kw)
    names = [t.name for t in dproto.graph.initializer]
    dsess, _ = create_session(dproto.SerializeToString(), providers=providers, threads=threads, profile=profile,
                              shared_threads=shared_threads,
                              configure=lambda so: weights.configure(so, names, folder=folder),
                              flavor=facts.graph_flavor(), **kw)
    model = ModelRunner(tsess, facts, max_len, slots, device=device, deterministic=deterministic)
    kept = [i for i in range(facts.layers) if i not in set(choice.skip)]
    skips = model.skip(dsess, kept)
    # both sessions read the weights from memory these arrays own (OrtValues borrow it): they must
    # live as long as either session does, so as either runner (every slot view holds its runner)
    model.shared_weights = skips.shared_weights = weights
    return SelfPair(model.slot(0), skips.slot(0), choice, weights, model, skips)


# --- engine wiring -------------------------------------------------------------------------------
def open_for_engine(bundle, max_len: int, *, required: bool, providers=None, threads=None,
                    profile=None, deterministic: bool = False, slots: int = 1) -> SelfPair | None:
    """open_pair for the engine (engine/batch.py from_plan, `slots` cache slots). With required=False, a
    self-draft that cannot be made is logged and skipped (None)."""
    import onnxruntime as ort

    from ..edge.providers import CPU, normalize

    facts = bundle.target
    try:
        usable = [p for p in normalize(providers) if p in set(ort.get_available_providers())]
        if usable[:1] != [CPU]:
            raise DraftUnavailable("draft='self' shares the weights between two CPU sessions (docs/runtime.md); "
                                   f"it is not available when {usable[0] if usable else 'no provider'} runs the "
                                   "target", param="draft")
        cpu = facts.graphs().get("cpu")  # the CPU provider's graph (float32 activations and KV)
        if cpu is None:
            raise DraftUnavailable("draft='self' runs on the CPU provider's graph, and this bundle has only a "
                                   f"{facts.graph_flavor()} one (export it with --ep cpu)", param="draft")
        choice = skip_for(facts)
        pair = open_pair(bundle.root / cpu.path, cpu, max_len, choice, providers=["cpu"],
                         threads=threads, shared_threads=True, profile=profile, deterministic=deterministic,
                         slots=slots)
    except DraftUnavailable:
        if required:
            raise
        log.info("auto drafting without the self-draft", exc_info=True)
        return None
    log.info("self-draft: skipping %d of %d layers %s (%s)", len(choice.skip), facts.layers, choice.skip,
             choice.source)
    return pair


def open_target(p, slots: int) -> tuple[ModelRunner, SelfPair | None]:
    """The engine's target (engine/batch.py): its runner of `slots` cache slots for the plan `p`
    (engine/build.Plan), on weights shared with the self-draft where the plan loads it and it can be
    made (then also its SelfPair), else on its own."""
    from . import build

    s, b = p.settings, p.bundle
    if "self" in p.runners:
        pair = open_for_engine(b, p.max_len, required=s.draft == "self", providers=p.providers, threads=p.threads,
                               profile=p.profile, deterministic=s.deterministic, slots=slots)
        if pair is not None:
            return pair.model, pair
    # with the draft model both take turns on one shared pool; alone, a pool of its own (onnxruntime's default)
    return build.load_model(b.model_path("target"), b.target, p.max_len, slots=slots, providers=p.providers,
                            threads=p.threads, profile=p.profile, shared_threads="draft" in p.runners,
                            deterministic=s.deterministic), None
