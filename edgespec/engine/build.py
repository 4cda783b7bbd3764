"""Building an engine's parts: the one place where the edge concerns (device profiles, providers,
graph flavors, memory plan, governor) are consulted. Everything here runs before the first request:

    Settings (settings.py) + bundle + board --plan()--> Plan --> Engine.from_plan (batch.py)
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.runner import ModelRunner, Slot
from ..edge import cache_length, devices, flavor, memcheck, memory, providers as prov
from ..edge import governor as gov
from ..models.bundle import Bundle
from ..models.manifest import ModelFacts
from .settings import Settings

log = logging.getLogger("edgespec.engine")


def load_model(path: Path, facts: ModelFacts, max_len: int, *, slots: int = 1, providers=None,
               threads: int | None = None, spinning: bool | None = None, shared_threads: bool = False, profile=None,
               force_flavor: bool | None = None, deterministic: bool = False) -> ModelRunner:
    """Creates the session (trying providers in order, see edge/providers.py) and its runner, with
    `slots` cache slots (server --parallel: the target, and the draft model when loaded).

    The graph is the bundle's one whose flavor matches the provider (edge/flavor.py open_session, the
    choice every path makes): a cpu-flavored graph on CUDA is refused unless `force_flavor`
    (default: $EDGESPEC_FORCE_FLAVOR).

    `shared_threads`: run on the process-wide thread pool (providers.use_shared_thread_pool),
    falling back to a pool of its own without spinning when that cannot be had. `spinning=False` alone is
    the fallback's setting: when two sessions take turns on the same cores, a pool thread
    busy-waiting after one session's step steals a core from the other's next step.
    `deterministic`: the runner's deterministic mode (core/runner.py, Settings.deterministic)."""
    kw: dict = {}
    # another engine in this process may have set the shared pool up: every session must then use it
    if (shared_threads and prov.use_shared_thread_pool(threads)) or prov.shared_pool_active():
        kw["shared_threads"] = True
    elif shared_threads:
        kw["spinning"] = False
    elif spinning is not None:
        kw["spinning"] = spinning

    def create(gpath, order, graph_flavor):
        return prov.create_session(gpath, providers=order, threads=threads, profile=profile, flavor=graph_flavor, **kw)

    chosen, session, device = flavor.open_session(facts, Path(path), providers, create, force=force_flavor)
    return ModelRunner(session, chosen, max_len, slots, device=device, deterministic=deterministic)


def load_runner(path: Path, facts: ModelFacts, max_len: int, **options) -> Slot:
    """One sequence's runner: slot 0 of a one-slot model (load_model's options)."""
    return load_model(path, facts, max_len, **options).slot(0)


def load_heads_session(path: Path):
    """The draft heads' session (a graph of a few to some tens of MB run on one row per round), on the
    CPU provider, on the shared thread pool when one is active, else on the calling thread alone:
    it runs right after a target step, whose pool threads may still be spinning on every core, and
    a pool of its own would wait for them (measured on the 2-core dev VM with SmolLM2-135M: ~8 ms of
    loop time per round with 2 threads of its own against 0.4-0.7 ms for the run itself)."""
    kw = {"shared_threads": True} if prov.shared_pool_active() else {"spinning": False}
    session, _ = prov.create_session(path, providers=[prov.CPU], threads=None if kw.get("shared_threads") else 1, **kw)
    return session


def draft_vocab_map(bundle: Bundle):
    """The pruned draft's logits row -> token id map (`export --draft-vocab`), or None."""
    facts = bundle.manifest.models.get("draft")
    if facts is None or not facts.vocab_map:
        return None
    import numpy as np

    return np.load(bundle.root / facts.vocab_map, allow_pickle=False)


def parallel_slots(b: Bundle, plan: memory.MemoryPlan) -> int:
    """`--parallel auto`: the slots the plan's budget fits after the weights (at most
    memory.MAX_AUTO_SLOTS); without a budget, 80 % of the memory available now is the budget."""
    budget = plan.budget_bytes
    if budget is None:
        avail = memcheck.available_bytes()
        if avail is None:
            return 1
        budget = int(avail * 0.8)
    return memory.slots_that_fit(b, plan, budget)


def auto_slots(bundle, settings: Settings | None = None, **options) -> int:
    """`--parallel auto`: as many slots as the memory plan fits after the weights (memory.py's
    slots_that_fit: the draft model's slots too where the mode loads it), at most
    memory.MAX_AUTO_SLOTS. The budget is the given one, else the device profile's, else 80 % of what
    the kernel reports available now."""
    import dataclasses

    s = settings if settings is not None else Settings.of(**options)
    p = plan(dataclasses.replace(s, parallel=1, verify=False), bundle)
    return parallel_slots(p.bundle, p.memory)


@dataclass(frozen=True)
class Plan:
    """Settings + bundle + board: what an engine loads, and how. The engine is built from one
    (`from_plan`); nothing below re-reads an option."""

    settings: Settings
    bundle: Bundle
    profile: devices.DeviceProfile | None  # the board's profile (None: no board defaults)
    providers: Any  # the target's provider order: the caller's, else the profile's, else None (default)
    draft_providers: Any
    threads: int | None
    memory: memory.MemoryPlan  # cache length, whether the draft model fits
    runners: frozenset[str]  # besides the target: "draft" (the draft model), "self" (self-draft), "heads"

    @property
    def max_len(self) -> int:
        return self.memory.max_len


def plan(settings: Settings, bundle) -> Plan:
    """The one step from settings to what gets loaded: the board (device profile) fills the options
    left unset, the drafting mode's row says which runners it wants (drafters/modes.py), the memory
    plan decides the cache length and whether the draft model fits. A mode that cannot run on this
    bundle is refused here, before any model loads. Without an importable onnxruntime, the one line that names
    both installs (edgespec.MISSING_ONNXRUNTIME)."""
    from ..errors import require_onnxruntime
    from ..drafters import modes

    require_onnxruntime()
    from ..errors import DraftUnavailable

    profile = None
    if settings.device is not None:
        profile = devices.with_measured_memory(devices.resolve(settings.device))
    given = lambda v: list(v) if v is not None and not isinstance(v, prov.ProfileOrder) else v  # noqa: E731
    d = devices.engine_defaults(profile, providers=given(settings.providers),
                                draft_providers=given(settings.draft_providers), threads=settings.threads,
                                online=devices.online_cores())
    b = bundle if isinstance(bundle, Bundle) else Bundle.open(bundle, verify=settings.verify)
    row = modes.get(settings.draft)
    if row.runner == "draft" and b.draft is None:
        raise DraftUnavailable(f"bundle {b.name} has no draft model: use draft='ngram' or 'auto'", param="draft")
    if row.runner == "self" and not b.target.self_draft:
        raise DraftUnavailable(f"bundle {b.name} has no self-draft (the layers draft='self' skips are chosen at "
                               "export): re-export it with `edgespec export ... --self-draft`", param="draft")
    if row.runner == "heads" and b.manifest.heads is None:
        from ..drafters.heads import NO_HEADS

        raise DraftUnavailable(NO_HEADS.format(name=b.name), param="draft")
    want_draft = "draft" in row.loads and b.draft is not None  # a slot per request slot (engine/draft_batch.py)
    mem = memory_plan(b, max_len=venue_max_len(settings, b, profile), want_draft=want_draft, profile=profile,
                      budget=settings.memory_budget, providers=d["providers"], docs=settings.docs)
    for note in mem.notes:  # what a budget changed matters; the rest is detail
        log.log(logging.INFO if mem.budget_bytes is not None else logging.DEBUG, "memory plan: %s", note)
    if row.runner == "draft" and not mem.load_draft:
        raise DraftUnavailable("the memory budget leaves no room for the draft model: use draft='ngram' "
                               "or 'auto', or raise the budget", param="draft")
    runners = {"draft"} if mem.load_draft else set()
    if "self" in row.loads:
        runners.add("self")
    if "heads" in row.loads and b.manifest.heads is not None:
        runners.add("heads")
    return Plan(settings, b, profile, d["providers"], d["draft_providers"], d["threads"], mem, frozenset(runners))


def venue_max_len(settings: Settings, b: Bundle, profile) -> int | None:
    """The cache length asked for; when none is and the documents' whole venue goes in the cache
    (docs/answer.py), the default grown to hold it with a conversation beside it."""
    if settings.max_len is not None or settings.docs is None:
        return settings.max_len
    from ..docs.answer import TURN_ROOM, venue_tokens_estimate

    venue = venue_tokens_estimate(settings.docs)
    default = cache_length.default_max_len(b, profile)
    return default if venue is None else max(default, venue + TURN_ROOM)


def memory_plan(b: Bundle, *, max_len, want_draft: bool, profile, budget: int | None,
                providers=None, docs=None) -> memory.MemoryPlan:
    """The memory module's plan: `budget` (bytes) or else the profile's default budget decides the
    cache length and whether the draft is loaded; with neither, nothing is shrunk. It counts the
    graph load_runner will pick for `providers` (flavor.planned: a bundle may hold two flavors), and
    where a cuda graph's cache lives. `docs`: a document index, counted with the embedding model it names."""
    import onnxruntime as ort

    from ..docs.embedder_folder import files_bytes

    available = ort.get_available_providers()
    first = flavor.first_usable(prov.normalize(providers), available)
    graph = flavor.planned(b.target, providers, available).graph_flavor()
    device = prov.device_of(first) if first and graph == "cuda" else "cpu"
    doc_lines = None
    if docs:
        doc_lines = memory.doc_lines(*files_bytes(docs=docs))
        if device == "cpu":  # the venue's rows kept on the host (pinned.py, venue_rows.py)
            from ..docs.answer import venue_rows_estimate

            venue = venue_rows_estimate(docs)
            if venue is not None:
                doc_lines["venue_rows"] = venue * b.target.kv_bytes_per_token()
    return memory.plan(b, max_len=max_len, want_draft=want_draft, budget_bytes=budget, profile=profile,
                       flavor=graph, device=device, doc_lines=doc_lines)


def sessions_spin(load_draft: bool) -> bool:
    """Whether the sessions just created busy-wait between ops (what the governor's fewer-cores rung
    depends on). The shared pool (providers.use_shared_thread_pool) always spins: the Python API of
    onnxruntime cannot turn spinning off for its global pool (docs/edge.md, "Spinning"); without the
    shared pool, two models fall back to per-session pools without spinning (load_runner), and a
    model alone gets a per-session pool with onnxruntime's default, spinning."""
    if prov.shared_pool_active():
        return True
    return not load_draft


def governor(p: Plan, *, spinning: bool):
    """A governor when a power or temperature limit is asked for or a device is named (then it
    measures energy and applies the profile's temperature limit); None otherwise."""
    s = p.settings
    if s.power_budget_w is None and s.max_temp_c is None and p.profile is None:
        return None
    return gov.from_options(device=p.profile, power_budget=s.power_budget_w, max_temp=s.max_temp_c,
                            spinning=spinning)
