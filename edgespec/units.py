"""Sizes and resident memory, one home for each: parsing and printing byte counts, reading RSS.

Binary units throughout for memory (GiB, MiB: what the kernel and systemd count in); decimal units
(GB, MB) for file sizes, as the export reports them.
"""
from __future__ import annotations

import math
import re

from .errors import InvalidRequest

_UNITS = {
    "": 1, "b": 1,
    "k": 1 << 10, "kib": 1 << 10, "kb": 10**3,
    "m": 1 << 20, "mib": 1 << 20, "mb": 10**6,
    "g": 1 << 30, "gib": 1 << 30, "gb": 10**9,
    "t": 1 << 40, "tib": 1 << 40, "tb": 10**12,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int) -> int:
    """'5GiB', '512M', '1.5G', '800MB', '1073741824' -> bytes.

    Short forms (K, M, G, T) are binary like systemd's MemoryMax; KB/MB/GB are decimal, KiB/MiB/GiB
    binary. A size must be positive: a zero budget is a typo, not a request."""
    if isinstance(text, bool):
        raise InvalidRequest(f"not a memory size: {text!r}", param="memory_budget")
    if isinstance(text, int):
        value = text
    else:
        m = _SIZE_RE.match(str(text))
        unit = m.group(2).lower() if m else None
        if not m or unit not in _UNITS:
            raise InvalidRequest(
                f"not a memory size: {text!r} (write e.g. 5GiB, 512M, 1.5G, 800MB or a number of bytes)",
                param="memory_budget",
            )
        value = int(float(m.group(1)) * _UNITS[unit])
    if value <= 0:
        raise InvalidRequest(f"memory size must be positive, got {text!r}", param="memory_budget")
    return value


def format_size(n: int | float) -> str:
    """Binary units with three significant digits: 1.13 GiB, 117 MiB, 512 B."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            if unit == "B":
                return f"{int(n)} B"
            return f"{n:.3g} {unit}" if abs(n) < 100 else f"{n:.0f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")




def format_bytes(n: float) -> str:
    """Decimal units (1 GB = 10^9 bytes): file sizes as the export and `verify` report them."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def measure_rss(pid: int | str = "self") -> dict[str, int]:
    """{"rss": current resident bytes, "peak": high-water mark} from /proc/<pid>/status (Linux)."""
    out: dict[str, int] = {}
    keys = {"VmRSS:": "rss", "VmHWM:": "peak", "RssAnon:": "anon", "RssFile:": "file"}
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                parts = line.split()
                if parts and parts[0] in keys:
                    out[keys[parts[0]]] = int(parts[1]) * 1024
    except OSError:
        pass
    return out


def peak_rss_bytes() -> int:
    """This process's peak resident memory so far (VmHWM; getrusage where /proc is missing)."""
    peak = measure_rss().get("peak")
    if peak:
        return peak
    import resource
    import sys

    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(r) if sys.platform == "darwin" else int(r) * 1024


# --- power and temperature (the governor's options) ---------------------------------------------
def parse_watts(value) -> float:
    """10, 10.5, "10W", "7.5 W" -> watts. Raises InvalidRequest otherwise."""
    return _parse_unit(value, ("w", "watt", "watts"), "power_budget", "a power budget like 10W")


def parse_celsius(value) -> float:
    """80, "80C", "80°C" -> degrees C. Raises InvalidRequest otherwise."""
    v = _parse_unit(value, ("c", "°c", "degc"), "max_temp", "a temperature like 80C")
    if not 0 < v < 150:
        raise InvalidRequest(f"max temperature {v:g} C is outside 0-150 C", param="max_temp")
    return v


def _parse_unit(value, units: tuple[str, ...], param: str, example: str) -> float:
    if isinstance(value, bool):
        raise InvalidRequest(f"not {example}: {value!r}", param=param)
    if isinstance(value, (int, float)):
        v = float(value)
    else:
        text = str(value).strip().lower().replace(" ", "")
        for u in sorted(units, key=len, reverse=True):
            if text.endswith(u):
                text = text[: -len(u)]
                break
        try:
            v = float(text)
        except ValueError:
            raise InvalidRequest(f"not {example}: {value!r}", param=param) from None
    if not (v > 0 and math.isfinite(v)):
        raise InvalidRequest(f"{param.replace('_', ' ')} must be positive, got {value!r}", param=param)
    return v
