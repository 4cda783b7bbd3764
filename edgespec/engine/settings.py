"""An engine's settings, resolved once where they enter: CLI flags, EDGESPEC_* variables (serve),
or Python keywords (Engine.open). `Settings.of(...)` checks every value and
raises the named error for the first bad one (each an EdgespecError naming its option), before
any bundle is read; what comes out is frozen and flows down unchanged:

    Settings  --build.plan(settings, bundle)-->  Plan (board, providers, memory plan, runners)
              --> Engine.from_plan (batch.py)

A default lives here once (the dataclass's field) or, for what depends on the bundle and the board
(the cache length, the provider order), in the plan step: `max_len=None` is the bundle's export
default (`manifest.defaults["max_len"]`, from `export --max-context`) capped by the board's profile
and the memory plan (edge/cache_length.py default_max_len, edge/memory.py).
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from ..drafters import modes
from ..errors import InvalidRequest
from ..limits import K_LIMIT, PARALLEL_LIMIT, SUFFIX_CAPACITY, TREE_MODES
from ..units import parse_celsius, parse_size, parse_watts


@dataclass(frozen=True)
class Settings:
    draft: str = "auto"  # the default drafting mode of requests (drafters/modes.py)
    k: int | None = None  # proposals per round; None: chosen every round from measured costs
    tree: str = "auto"  # the default tree verification of requests: auto | on | off
    max_len: int | None = None  # cache length; None: the bundle's default capped by the board
    suffix_capacity: int = SUFFIX_CAPACITY  # tokens the suffix index keeps across requests
    threads: int | None = None  # onnxruntime intra-op threads; None: the profile's, else onnxruntime's
    providers: tuple[str, ...] | None = None  # the target's provider order; None: the profile's or default
    draft_providers: tuple[str, ...] | None = None  # the draft model's; None: the target's
    device: Any = None  # None (no board defaults) | "auto" | a profile name | a DeviceProfile
    memory_budget: int | None = None  # bytes
    power_budget_w: float | None = None
    max_temp_c: float | None = None
    parallel: int = 1  # cache slots: requests decoded together (engine/batch.py)
    verify: bool = True  # sha256 of the bundle's files at open
    warmup: bool = True  # time the step sizes once at open
    deterministic: bool = False  # the runners' deterministic mode (core/runner.py); requests pinned to chains
    docs: Any = None  # an index folder (`edgespec index`): chat turns answer from its documents (docs/answer.py)

    @classmethod
    def of(cls, *, memory_budget=None, power_budget=None, max_temp=None, providers=None, draft_providers=None,
           **kw) -> "Settings":
        """Checks and converts every value (sizes like "3GiB", watts like "10W", provider lists like
        "cuda,cpu"), then the combinations (tree="on" in deterministic mode). Unknown keywords are a TypeError,
        as for any Python call."""
        known = {f.name for f in fields(cls)} - {"power_budget_w", "max_temp_c"}
        unknown = sorted(set(kw) - known)
        if unknown:
            raise TypeError(f"unknown engine option(s): {', '.join(unknown)}")
        s = cls(
            memory_budget=parse_size(memory_budget) if memory_budget is not None else None,
            power_budget_w=parse_watts(power_budget) if power_budget is not None else None,
            max_temp_c=parse_celsius(max_temp) if max_temp is not None else None,
            providers=_providers(providers, "providers"),
            draft_providers=_providers(draft_providers, "draft_providers"),
            **kw,
        )
        s.check()
        return s

    def replace(self, **kw) -> "Settings":
        """A copy with some settings changed, checked again."""
        s = replace(self, **kw)
        s.check()
        return s

    def check(self) -> None:
        modes.get(self.draft)
        check_k(self.k)
        check_tree(self.tree)
        from ..drafters.suffix_index import check_capacity
        from ..edge.cache_length import check_max_len

        if self.max_len is not None:
            check_max_len(self.max_len)

        check_capacity(self.suffix_capacity)
        t = self.threads
        if t is not None and (isinstance(t, bool) or not isinstance(t, int) or not 1 <= t <= 1024):
            raise InvalidRequest(f"threads must be an integer from 1 to 1024 (or None: onnxruntime's default), "
                                 f"got {t!r}", param="threads")
        if self.device is not None and not hasattr(self.device, "providers"):
            _check_device(self.device)
        if self.memory_budget is not None and self.memory_budget <= 0:
            raise InvalidRequest(f"memory budget must be positive, got {self.memory_budget}", param="memory_budget")
        if self.deterministic and self.tree == "on":
            raise InvalidRequest("tree='on' is not possible in deterministic mode: use tree='auto' or 'off'",
                                 param="tree")
        from ..docs.answer import check_docs

        check_docs(self.docs)
        p = self.parallel
        if isinstance(p, bool) or not isinstance(p, int) or not 1 <= p <= PARALLEL_LIMIT:
            raise InvalidRequest(f"parallel must be an integer from 1 to {PARALLEL_LIMIT}, got {p!r}", param="parallel")

    @property
    def batched(self) -> bool:
        return self.parallel > 1


def check_k(k) -> None:
    """A request's or an engine's k: proposals per round, 1 to limits.K_LIMIT; None (a request
    leaving it out) chooses it every round."""
    if k is None:
        return
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= K_LIMIT:
        raise InvalidRequest(f"k must be an integer from 1 to {K_LIMIT} (or left out: chosen each round), "
                             f"got {k!r}", param="k")


def check_tree(mode) -> None:
    if mode not in TREE_MODES:
        raise InvalidRequest(f"unknown tree mode {mode!r}: choose one of {', '.join(TREE_MODES)}", param="tree")


def _providers(value, param: str) -> tuple[str, ...] | None:
    """A provider list, checked now (an unknown name is one line naming it)."""
    if value is None:
        return None
    from ..edge.providers import ProfileOrder, normalize

    try:
        names = normalize(value)
    except InvalidRequest as e:
        if param == "providers":
            raise
        raise InvalidRequest(f"draft providers: {e}", param=param) from None
    return ProfileOrder(names) if isinstance(value, ProfileOrder) else tuple(names)  # type: ignore[return-value]


def _check_device(device) -> None:
    """A profile name must be known now; "auto" is detected when the plan is made."""
    if not isinstance(device, str):
        raise InvalidRequest(f"device must be a name or 'auto', got {type(device).__name__}", param="device")
    if device.strip().lower() in ("", "auto"):
        return
    from ..edge import devices

    devices.get(device)
