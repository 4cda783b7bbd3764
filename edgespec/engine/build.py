"""Building an engine's parts: the one place where the edge concerns (device profiles, providers,
memory plan, governor) are consulted. Everything here runs before the first request.
"""
from __future__ import annotations

from pathlib import Path

from ..core.batch_runner import BatchRunner, check_batchable
from ..core.runner import ModelRunner
from ..edge import devices, flavor, memory, providers as prov
from ..edge import governor as gov
from ..errors import InvalidRequest
from ..models.bundle import Bundle
from ..models.manifest import ModelFacts
from ..units import parse_celsius, parse_size, parse_watts


def load_runner(path: Path, facts: ModelFacts, max_len: int, *, providers=None, threads: int | None = None,
                spinning: bool | None = None, shared_threads: bool = False, profile=None,
                force_flavor: bool | None = None, deterministic: bool = False) -> ModelRunner:
    """Creates the session (trying providers in order, see edge/providers.py) and its runner.

    The graph is the bundle's one whose flavor matches the provider (edge/flavor.py): with a cpu and
    a cuda graph, the cuda one is loaded when CUDA comes first in the order, and the cpu one when the
    session ends up on the CPU anyway. A cpu-flavored graph on CUDA is refused (flavor.check) unless
    `force_flavor` (default: $EDGESPEC_FORCE_FLAVOR).

    `shared_threads`: run on the process-wide thread pool (providers.use_shared_thread_pool),
    falling back to a pool of its own without spinning when that cannot be had. `spinning=False` alone is
    the fallback's setting: when two sessions take turns on the same cores, a pool thread
    busy-waiting after one session's step steals a core from the other's next step."""
    import onnxruntime as ort

    kw: dict = {}
    # another engine in this process may have set the shared pool up: every session must then use it
    if (shared_threads and prov.use_shared_thread_pool(threads)) or prov.shared_pool_active():
        kw["shared_threads"] = True
    elif shared_threads:
        kw["spinning"] = False
    elif spinning is not None:
        kw["spinning"] = spinning
    root = _bundle_root(Path(path), facts)
    graphs = facts.graphs() if root is not None else {facts.graph_flavor(): facts}
    first = flavor.first_usable(prov.normalize(providers), ort.get_available_providers())
    chosen = flavor.choose(facts, first) if root is not None else facts
    gpath = root / chosen.path if root is not None else Path(path)
    session, device = prov.create_session(gpath, providers=providers, threads=threads, profile=profile,
                                          flavor=chosen.graph_flavor(), **kw)
    got = flavor.flavor_for_device(device)
    if got != chosen.graph_flavor() and got in graphs:
        # the GPU provider failed and the session fell to the CPU: load the graph made for it
        chosen = graphs[got]
        session, device = prov.create_session(root / chosen.path, providers=[prov.CPU], threads=threads,
                                              profile=profile, flavor=got, **kw)
    flavor.check(chosen, device, force=force_flavor)
    return ModelRunner(session, chosen, max_len, device=device, deterministic=deterministic)


def load_heads_session(path: Path):
    """The draft heads' session (a graph of a few to some tens of MB run on one row per round), on the
    CPU provider, on the shared thread pool when one is active, else on the calling thread alone:
    it runs right after a target step, whose pool threads may still be spinning on every core, and
    a pool of its own would wait for them (measured on the 2-core dev VM with SmolLM2-135M: ~8 ms of
    loop time per round with 2 threads of its own against 0.4-0.7 ms for the run itself)."""
    kw = {"shared_threads": True} if prov.shared_pool_active() else {"spinning": False}
    session, _ = prov.create_session(path, providers=[prov.CPU], threads=None if kw.get("shared_threads") else 1, **kw)
    return session


def _bundle_root(path: Path, facts: ModelFacts) -> Path | None:
    """The bundle folder `path` (= root / facts.path) is in, or None for a graph outside a bundle."""
    rel = Path(facts.path).parts
    if len(path.parts) > len(rel) and path.parts[-len(rel):] == rel:
        return path.parents[len(rel) - 1]
    return None


def load_batch_runner(path: Path, facts: ModelFacts, max_len: int, slots: int, *, providers=None,
                      threads: int | None = None, profile=None, deterministic: bool = False) -> BatchRunner:
    """The target with `slots` cache slots (server --parallel): one session, no draft model."""
    # on the process-wide pool like load_runner's sessions: an engine opened later in this process
    # (a test, a bench) then finds the same thread setup whichever kind of engine came first
    check_batchable(facts, slots)  # before the session: a cuda graph cannot batch on any provider
    shared = prov.use_shared_thread_pool(threads) or prov.shared_pool_active()
    session, device = prov.create_session(path, providers=providers, threads=threads, profile=profile,
                                          shared_threads=shared, flavor=facts.graph_flavor())
    return BatchRunner(session, facts, max_len, slots, device=device, deterministic=deterministic)


def parallel_slots(b: Bundle, plan: memory.MemoryPlan) -> int:
    """`--parallel auto`: the slots the plan's budget fits after the weights (at most
    memory.MAX_AUTO_SLOTS); without a budget, 80 % of the memory available now is the budget."""
    budget = plan.budget_bytes
    if budget is None:
        avail = memory.available_bytes()
        if avail is None:
            return 1
        budget = int(avail * 0.8)
    return memory.slots_that_fit(b, plan, budget)


def edge_options(device, providers, draft_providers, threads, memory_budget, power_budget, max_temp) -> dict:
    """Checks the device and edge options (each bad value is an InvalidRequest naming its option)
    and fills what the caller left unset from the device profile (devices.engine_defaults).

    device: None -> no profile (onnxruntime's defaults, no default memory budget); "auto" -> the
    board this runs on, detected; a name or alias -> that profile; a DeviceProfile -> itself. A
    profile's memory is what this machine's kernel reports when the profile has none (a Pi 4) or
    when it is the board itself. Explicit options always win over the profile."""
    profile = None
    if device is not None:
        profile = devices.with_measured_memory(devices.resolve(device))
    if providers is not None:
        prov.normalize(providers)
    if draft_providers is not None:
        try:
            prov.normalize(draft_providers)
        except InvalidRequest as e:
            raise InvalidRequest(f"draft providers: {e}", param="draft_providers") from None
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= 1024):
        raise InvalidRequest(f"threads must be an integer from 1 to 1024 (or None: onnxruntime's default), "
                             f"got {threads!r}", param="threads")
    out = devices.engine_defaults(profile, providers=providers, draft_providers=draft_providers, threads=threads)
    out["profile"] = profile
    out["memory_budget"] = parse_size(memory_budget) if memory_budget is not None else None
    out["power_budget_w"] = parse_watts(power_budget) if power_budget is not None else None
    out["max_temp_c"] = parse_celsius(max_temp) if max_temp is not None else None
    return out


def memory_plan(b: Bundle, *, max_len, want_draft: bool, profile, budget: int | None,
                providers=None) -> memory.MemoryPlan:
    """The memory module's plan: `budget` (bytes) or else the profile's default budget decides the
    cache length and whether the draft is loaded; with neither, nothing is shrunk. It counts the
    graphs load_runner will pick for `providers` (a bundle may hold two flavors)."""
    import onnxruntime as ort

    first = flavor.first_usable(prov.normalize(providers), ort.get_available_providers())
    graph = flavor.choose(b.target, first).graph_flavor()
    return memory.plan(b, max_len=max_len, want_draft=want_draft, budget_bytes=budget, profile=profile,
                       flavor=graph, device=prov.device_of(first) if first and graph == "cuda" else "cpu")


def sessions_spin(load_draft: bool) -> bool:
    """Whether the sessions just created busy-wait between ops (what the governor's fewer-cores rung
    depends on). The shared pool (providers.use_shared_thread_pool) always spins: the Python API of
    onnxruntime cannot turn spinning off for its global pool (docs/edge.md, "Spinning"); without the
    shared pool, two models fall back to per-session pools without spinning (load_runner), and a
    model alone gets a per-session pool with onnxruntime's default, spinning."""
    if prov.shared_pool_active():
        return True
    return not load_draft


def governor(edge: dict, *, spinning: bool):
    """A governor when a power or temperature limit is asked for or a device is named (then it
    measures energy and applies the profile's temperature limit); None otherwise."""
    if edge["power_budget_w"] is None and edge["max_temp_c"] is None and edge["profile"] is None:
        return None
    return gov.from_options(device=edge["profile"], power_budget=edge["power_budget_w"],
                            max_temp=edge["max_temp_c"], spinning=spinning)
