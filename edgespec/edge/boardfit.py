"""Does a bundle fit a board? One answer for `edgespec plan --device X` and the "fits memory" column of
`edgespec bench --project`: both run the memory plan (memory.plan) for that board, its flavor and
provider, its default cache length and budget, and read the outcome the same way.

A board planned for from elsewhere runs its profile's first provider (a Jetson: CUDA, the cuda-flavored
graph when the bundle has one); the board this runs on runs the first provider this onnxruntime has.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import BudgetError
from . import memory


def runs_on(bundle, profile, here: bool) -> tuple[str | None, str]:
    """(graph flavor, "cuda" | "cpu"): where the engine would run the target on this profile: the first
    provider of its order that this onnxruntime has (here), or its first provider (a board planned
    for from elsewhere). The device side is planned only for a cuda-flavored graph on CUDA."""
    from . import flavor as fl
    from .providers import device_of, normalize

    order = normalize(getattr(profile, "providers", None) or None)
    if here:
        import onnxruntime as ort

        available = ort.get_available_providers()
    else:
        available = order
    first = fl.first_usable(order, available)
    graph = fl.planned(bundle.target, order, available).graph_flavor()  # the engine's own choice
    device = device_of(first) if first and graph == "cuda" else "cpu"
    return graph, device


@dataclass(frozen=True)
class BoardFit:
    """`fits`: None when the board has no memory size to plan against (a Pi 4 named from elsewhere).
    `text`: the same outcome in a few words, e.g. "yes (62 %)", "yes, max_len 1024 (99 %)",
    "without the draft (88 %)", "NO: needs 4.1 GiB of 3.2 GiB"."""

    fits: bool | None
    text: str

    def to_dict(self) -> dict:
        return {"fits": self.fits, "text": self.text}


def fit(bundle, profile, *, want_draft: bool, max_len: int | None = None, here: bool = False) -> BoardFit:
    """The memory plan for `profile` (see module docstring), in words. `bundle`: a Bundle or its folder."""
    from ..models.bundle import Bundle

    bundle = bundle if isinstance(bundle, Bundle) else Bundle.open(bundle, verify=False)
    if profile.memory_budget_bytes is None:
        return BoardFit(None, "? (the profile has no memory size: plan it with --memory-budget)")
    flavor, device = runs_on(bundle, profile, here)
    try:
        p = memory.plan(bundle, max_len=max_len, want_draft=want_draft, budget_bytes=None, profile=profile,
                        flavor=flavor, device=device)
    except BudgetError as e:
        from ..units import format_size

        need, budget = getattr(e, "needed_bytes", None), getattr(e, "budget_bytes", None)
        return BoardFit(False, f"NO: needs {format_size(need)} of {format_size(budget)}" if need and budget
                        else f"NO: {str(e).splitlines()[0]}")
    share = f"{100 * p.predicted_bytes / p.budget_bytes:.0f} %"
    if want_draft and not p.load_draft:
        return BoardFit(True, f"without the draft ({share})")
    if p.requested_max_len is not None and p.max_len < p.requested_max_len:
        return BoardFit(True, f"yes, max_len {p.max_len} ({share})")
    return BoardFit(True, f"yes ({share})")


def every_board(bundle, *, want_draft: bool) -> dict[str, dict]:
    """Every known profile's fit (kept in a bench run's JSON, so a later `--project` of the saved run
    says what `plan` says without the bundle)."""
    from . import devices

    return {pid: fit(bundle, p, want_draft=want_draft).to_dict() for pid, p in sorted(devices.profiles().items())}
