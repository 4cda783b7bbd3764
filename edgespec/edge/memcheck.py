"""A memory plan (edge/memory.py) against the machine it runs on: what the kernel says it has
(<root>/proc/meminfo: MemTotal for a board's size, MemAvailable for "would this fit right now")
and what the process really held once loaded (peak RSS, units.measure_rss), so every load can
check the prediction again. Reading /proc needs no bundle: devices.py and gpumem.py read it here
without importing the planner.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..units import format_size, measure_rss
from .memory import LAZY_PARTS

if TYPE_CHECKING:
    from .memory import MemoryPlan


@dataclass
class MemoryCheck:
    predicted_bytes: int
    measured_bytes: int

    @property
    def error(self) -> float:
        """(measured - predicted) / measured: positive means the plan under-predicted."""
        return (self.measured_bytes - self.predicted_bytes) / max(1, self.measured_bytes)

    def describe(self) -> str:
        return (
            f"memory: predicted {format_size(self.predicted_bytes)}, measured {format_size(self.measured_bytes)} "
            f"RSS ({100 * self.error:+.1f} %)"
        )


def compare(plan_: MemoryPlan, measured_bytes: int | None = None) -> MemoryCheck:
    """Predicted vs measured resident memory of this process (peak RSS unless given). The measurement
    is of an engine that has just opened, whose suffix index holds nothing yet and whose grammar view
    is not built: those parts (memory.LAZY_PARTS, what a long-running server grows to) are left out of
    the comparison."""
    if measured_bytes is None:
        m = measure_rss()
        measured_bytes = m.get("peak") or m.get("rss") or 0
    lazy = sum(plan_.breakdown.get(k, 0) for k in LAZY_PARTS)
    return MemoryCheck(plan_.predicted_bytes - lazy, int(measured_bytes))


def available_bytes(root: str | os.PathLike = "/") -> int | None:
    """MemAvailable from <root>/proc/meminfo: what the kernel thinks can be allocated without swapping."""
    info = meminfo(root)
    return info.get("MemAvailable")


def meminfo(root: str | os.PathLike = "/") -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        text = (Path(root) / "proc/meminfo").read_text(encoding="ascii", errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        parts = line.replace(":", " ").split()
        if len(parts) >= 2 and parts[1].isdigit():
            mult = 1024 if len(parts) > 2 and parts[2].lower() == "kb" else 1
            out[parts[0]] = int(parts[1]) * mult
    return out


def fits_now(plan_: MemoryPlan, root: str | os.PathLike = "/") -> str | None:
    """A warning line when the plan needs more than the kernel says is available right now."""
    avail = available_bytes(root)
    if avail is not None and plan_.predicted_bytes > avail:
        return (
            f"the plan needs {format_size(plan_.predicted_bytes)} but only {format_size(avail)} is available "
            f"now (MemAvailable): expect swapping or an out-of-memory kill; set --memory-budget"
        )
    return None
