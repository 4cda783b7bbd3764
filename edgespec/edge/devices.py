"""Device profiles: what edgespec knows about a board (memory, bandwidth, cores, providers, power
modes, sensor rules, default threads and budgets), one JSON file per board in the top-level devices/ folder (shipped as the runtime's package data
`edgespec/devices`, a link to it in the source tree, and read through importlib.resources only), and
detection of the board it is running on.

Detection reads <root>/proc/device-tree/model (Jetson, Raspberry Pi), <root>/etc/nv_tegra_release
(any Jetson, with its L4T release), <root>/proc/cpuinfo and <root>/proc/meminfo; the memory size
tells board variants apart (Pi 5 4/8/16 GB). `root` lets tests run detection on fake trees. A board
that matches no profile falls back to the generic profile of its CPU architecture, with a note.
"""
from __future__ import annotations

import copy
import json
import logging
import os
import platform
import re
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import InvalidRequest
from ..limits import DEFAULT_MAX_LEN
from . import releases
from .memcheck import meminfo
from .providers import ProfileOrder

log = logging.getLogger(__name__)
GIB = 1 << 30
# /proc/cpuinfo "CPU part" of the ARM cores these boards use
ARM_PARTS = {"0xd03": "Cortex-A53", "0xd07": "Cortex-A57", "0xd08": "Cortex-A72", "0xd0b": "Cortex-A76",
             "0xd0c": "Neoverse-N1", "0xd41": "Cortex-A78", "0xd42": "Cortex-A78AE", "0xd4b": "Cortex-A78C"}


@dataclass
class DeviceProfile:
    id: str
    name: str
    family: str  # "jetson" | "raspberrypi" | "generic"
    arch: str  # "aarch64" | "x86_64"
    memory_bytes: int | None  # physical memory (shared with the GPU on a Jetson); None: read from /proc
    memory_reserve_bytes: int | None  # left to the OS, desktop, CUDA context; None: no default budget
    bandwidth_gbs: float | None
    cpu_cores: int | None
    cpu_model: str | None
    providers: list[str]  # preferred order for the target model
    draft_providers: list[str]  # the draft may run elsewhere (e.g. CPU cores while the GPU verifies)
    default_threads: int | None
    default_max_len: int
    gpu: str | None = None
    memory_shared_with_gpu: bool = False
    # nvpmodel modes by set ("standard"; "super": JetPack 6.2's Super flash config), each {"id", "name", "watts"};
    # which sets a JetPack release can have is the release table's (edge/releases.py)
    power_modes: dict[str, list[dict]] = field(default_factory=dict)
    supply_w: float | None = None
    default_power_budget_w: float | None = None
    max_temp_c: float | None = None
    trt: dict | None = None  # {"fp16": bool, "workspace_gib": float}
    sensors: dict = field(default_factory=dict)  # rules for sensors.discover
    detect: dict = field(default_factory=dict)  # {"model": [...], "memory_gib": [lo, hi], "tegra": bool, "arch": ...}
    install: dict = field(default_factory=dict)  # what to install for missing providers, per provider
    aliases: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    detected: dict = field(default_factory=dict)  # filled by detect(): what was read and why this profile

    @property
    def memory_budget_bytes(self) -> int | None:
        """Default memory budget: physical memory less the reserve for everything else."""
        if self.memory_bytes is None or self.memory_reserve_bytes is None:
            return None
        return max(0, self.memory_bytes - self.memory_reserve_bytes)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "DeviceProfile":
        cpu = d.get("cpu") or {}
        gib = lambda v: None if v is None else int(float(v) * GIB)  # noqa: E731
        return cls(
            id=d["id"], name=d["name"], family=d["family"], arch=d["arch"],
            memory_bytes=gib(d.get("memory_gib")), memory_reserve_bytes=gib(d.get("memory_reserve_gib")),
            bandwidth_gbs=d.get("bandwidth_gbs"), cpu_cores=cpu.get("cores"), cpu_model=cpu.get("model"),
            providers=list(d.get("providers") or ["cpu"]), draft_providers=list(d.get("draft_providers") or ["cpu"]),
            default_threads=d.get("default_threads"), default_max_len=int(d.get("default_max_len") or DEFAULT_MAX_LEN),
            gpu=d.get("gpu"), memory_shared_with_gpu=bool(d.get("memory_shared_with_gpu")),
            power_modes=dict(d.get("power_modes") or {}), supply_w=d.get("supply_w"),
            default_power_budget_w=d.get("default_power_budget_w"), max_temp_c=d.get("max_temp_c"),
            trt=d.get("trt"), sensors=dict(d.get("sensors") or {}), detect=dict(d.get("detect") or {}),
            install=dict(d.get("install") or {}), aliases=list(d.get("aliases") or []), notes=list(d.get("notes") or []),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "name": self.name, "family": self.family, "arch": self.arch,
            "memory_bytes": self.memory_bytes, "memory_budget_bytes": self.memory_budget_bytes,
            "bandwidth_gbs": self.bandwidth_gbs, "cpu_cores": self.cpu_cores, "cpu_model": self.cpu_model,
            "gpu": self.gpu, "providers": self.providers, "draft_providers": self.draft_providers,
            "default_threads": self.default_threads, "default_max_len": self.default_max_len,
            "power_modes": self.power_modes, "supply_w": self.supply_w, "max_temp_c": self.max_temp_c,
            "notes": self.notes, "detected": self.detected,
        }


def profile_files() -> list:
    """The board profiles, one JSON resource per board, sorted by name (a name starting with "_" is other data). A runtime installed without its
    package data is broken, not merely unconfigured: say so instead of detecting nothing."""
    folder = resources.files("edgespec") / "devices"
    found = sorted((f for f in folder.iterdir() if f.name.endswith(".json") and not f.name.startswith("_")),
                   key=lambda f: f.name) if folder.is_dir() else []  # "_releases.json": the release table
    if not found:
        raise FileNotFoundError(f"no device profiles found in {folder} (the package data edgespec/devices)")
    return found


@lru_cache(maxsize=1)
def _load_all() -> dict[str, DeviceProfile]:
    out: dict[str, DeviceProfile] = {}
    for f in profile_files():
        d = json.loads(f.read_text(encoding="utf-8"))
        p = DeviceProfile.from_dict(d)
        if p.id != f.name.removesuffix(".json"):
            raise ValueError(f"{f}: id {p.id!r} does not match the file name")
        out[p.id] = p
    return out


def profiles() -> dict[str, DeviceProfile]:
    """Every known profile by id (copies: callers may change them)."""
    return {k: copy.deepcopy(v) for k, v in _load_all().items()}


def get(name: str) -> DeviceProfile:
    """A profile by id or alias ("jetson-orin-nano-8gb", "orin-nano", "pi5-8gb"); unknown names are
    a user error that lists the known ones."""
    key = name.strip().lower()
    all_ = _load_all()
    if key in all_:
        return copy.deepcopy(all_[key])
    for p in all_.values():
        if key in (a.lower() for a in p.aliases):
            return copy.deepcopy(p)
    raise InvalidRequest(f"unknown device {name!r}; known devices: {', '.join(sorted(all_))} (or 'auto')", param="device")


def resolve(device=None, *, root: str | os.PathLike = "/") -> DeviceProfile:
    """None or "auto": detect the board under `root`; a name: that profile; a profile: itself."""
    if isinstance(device, DeviceProfile):
        return device
    if device is None or (isinstance(device, str) and device.strip().lower() in ("", "auto")):
        return detect(root)
    if not isinstance(device, str):
        raise InvalidRequest(f"device must be a name or 'auto', got {type(device).__name__}", param="device")
    return get(device)


# --- reading the board ---------------------------------------------------------------------------
def _read(root: Path, rel: str) -> str | None:
    try:
        return (root / rel).read_bytes().decode("utf-8", errors="replace")
    except OSError:
        return None


def read_board(root: str | os.PathLike = "/") -> dict[str, Any]:
    """Raw facts from the tree: device-tree model, L4T release, CPU and memory."""
    root = Path(root)
    facts: dict[str, Any] = {"root": str(root)}
    model = _read(root, "proc/device-tree/model") or _read(root, "sys/firmware/devicetree/base/model")
    facts["model"] = model.replace("\x00", "").strip() if model else None
    compatible = _read(root, "proc/device-tree/compatible")
    facts["compatible"] = [c for c in compatible.split("\x00") if c] if compatible else []
    tegra = _read(root, "etc/nv_tegra_release")
    facts["tegra_release"] = None
    if tegra is not None:
        m = re.search(r"R(\d+)\s*\(release\),\s*REVISION:\s*([0-9.]+)", tegra)
        l4t = f"{m.group(1)}.{m.group(2)}" if m else tegra.strip().splitlines()[0] if tegra.strip() else "unknown"
        facts["tegra_release"] = l4t
        row = releases.jetpack_row(l4t)
        facts["jetpack"] = row["jetpack"] if row else None
        facts["jetpack_exact"] = bool(row and row["exact"])
    cpuinfo = _read(root, "proc/cpuinfo") or ""
    procs = re.findall(r"^processor\s*:", cpuinfo, flags=re.M)
    facts["cpu_count"] = len(procs) or (os.cpu_count() if str(root) == "/" else None)
    facts["cpu_online"] = online_cores(root)
    if re.search(r"^CPU implementer\s*:", cpuinfo, flags=re.M) or re.search(r"^Features\s*:.*\basimd\b", cpuinfo, flags=re.M):
        arch = "aarch64"
    elif re.search(r"^(vendor_id|flags)\s*:", cpuinfo, flags=re.M):
        arch = "x86_64"
    else:
        arch = platform.machine() if str(root) == "/" else None
    facts["arch"] = {"arm64": "aarch64", "AMD64": "x86_64"}.get(arch or "", arch)
    m = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, flags=re.M)
    part = re.search(r"^CPU part\s*:\s*(0x[0-9a-fA-F]+)", cpuinfo, flags=re.M)
    facts["cpu_model"] = m.group(1).strip() if m else (ARM_PARTS.get(part.group(1).lower()) if part else None)
    if not facts["model"]:
        m = re.search(r"^Model\s*:\s*(.+)$", cpuinfo, flags=re.M)  # Raspberry Pi kernels put it here too
        if m:
            facts["model"] = m.group(1).strip()
    mem = meminfo(root)
    facts["mem_total"] = mem.get("MemTotal")
    facts["mem_available"] = mem.get("MemAvailable")
    return facts


def _cpu_list_count(text: str) -> int | None:
    """"0-3,6" -> 5: the kernel's CPU list format (sysfs cpu/online), None when it does not parse."""
    n = 0
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            return None
        n += (int(hi) - int(lo) + 1) if hi else 1
    return n or None


def online_cores(root: str | os.PathLike = "/") -> int | None:
    """The CPU cores online now (<root>/sys/devices/system/cpu/online): a low nvpmodel mode takes cores offline,
    and a thread count above this only makes threads wait on each other. None where sysfs does not say."""
    text = _read(Path(root), "sys/devices/system/cpu/online")
    return _cpu_list_count(text) if text else None


def clamp_threads(threads: int | None, online: int | None) -> int | None:
    """A default thread count never above the cores online (an unknown count changes nothing)."""
    if threads is None or online is None:
        return threads
    return max(1, min(int(threads), int(online)))


_warned: set[str] = set()


def _warn_once(msg: str) -> None:
    if msg not in _warned:
        _warned.add(msg)
        log.warning("%s", msg)


def _matches(p: DeviceProfile, facts: dict) -> tuple[bool, bool]:
    """(family matches, memory matches too)."""
    rule = p.detect
    if not rule.get("model"):
        return False, False
    model = (facts.get("model") or "")
    if not any(s.lower() in model.lower() for s in rule["model"]):
        return False, False
    if any(s.lower() in model.lower() for s in rule.get("exclude", ())):  # "Raspberry Pi 5" is in "... Pi 500"
        return False, False
    if rule.get("tegra") and facts.get("tegra_release") is None and "nvidia" not in model.lower():
        return False, False
    lo_hi = rule.get("memory_gib")
    if lo_hi and facts.get("mem_total"):
        gib = facts["mem_total"] / GIB
        return True, lo_hi[0] <= gib < lo_hi[1]
    return True, True


def detect(root: str | os.PathLike = "/") -> DeviceProfile:
    """The profile of the board under `root`, with `memory_bytes`/`cpu_cores` taken from what the
    kernel reports and `detected` saying what was read and which rule matched."""
    facts = read_board(root)
    all_ = _load_all()
    exact = [p for p in all_.values() if _matches(p, facts) == (True, True)]
    family = [p for p in all_.values() if _matches(p, facts)[0]]
    notes: list[str] = []
    if exact:
        chosen = exact[0]
        how = f"device-tree model {facts['model']!r}"
        if chosen.detect.get("memory_gib"):
            how += f" and {facts['mem_total'] / GIB:.1f} GiB of memory"
    elif family:
        # a variant we have no file for (e.g. a Pi 5 2GB): the nearest memory size of the same board
        gib = (facts.get("mem_total") or 0) / GIB
        chosen = min(family, key=lambda p: abs((p.memory_bytes or 0) / GIB - gib))
        how = f"device-tree model {facts['model']!r}; no profile for {gib:.1f} GiB, using the nearest"
        notes.append(f"no profile for this memory size; using {chosen.id} with the memory the kernel reports")
        _warn_once(f"board guessed: {facts['model']!r} with {gib:.1f} GiB matches no profile exactly; using {chosen.id}'s "
                   "bandwidth and defaults (threads clamped to the cores online): pass --device to name it")
    else:
        arch = facts.get("arch") or platform.machine()
        chosen = all_.get(f"generic-{arch}") or all_["generic-x86_64"]
        how = f"CPU architecture {arch}"
        if facts.get("tegra_release"):
            notes.append(f"a Jetson (L4T {facts['tegra_release']}) that matches no profile: {facts.get('model')!r}")
        elif facts.get("model"):
            notes.append(f"board {facts['model']!r} matches no profile")
        if facts.get("tegra_release") or facts.get("model"):
            _warn_once(f"board guessed: {notes[-1]}; using the generic {arch} profile (no bandwidth, no GPU): pass "
                       "--device to name it")
    p = copy.deepcopy(chosen)
    if facts.get("mem_total"):
        p.memory_bytes = int(facts["mem_total"])
    if facts.get("cpu_online") or facts.get("cpu_count"):
        p.cpu_cores = int(facts.get("cpu_online") or facts["cpu_count"])
    online = facts.get("cpu_online") or facts.get("cpu_count")
    if p.default_threads and online and p.default_threads > online:
        notes.append(f"{online} cores online (the profile's {p.default_threads} threads clamped to them: a power mode "
                     "or the kernel took cores offline)")
        p.default_threads = clamp_threads(p.default_threads, online)
    if p.cpu_model is None and facts.get("cpu_model"):
        p.cpu_model = facts["cpu_model"]
    p.notes = p.notes + notes
    p.detected = {"how": how, **{k: v for k, v in facts.items() if k != "root"}}
    p.detected["memory_source"] = "measured" if facts.get("mem_total") else ("profile" if p.memory_bytes else "unknown")
    return p


def engine_defaults(profile: DeviceProfile | None, *, providers=None, draft_providers=None,
                    threads: int | None = None, online: int | None = None) -> dict[str, Any]:
    """What Engine.open should use when the caller left an option unset: the profile's provider
    orders and thread count. Explicit values always win; without a profile nothing changes.

    A provider order taken from the profile is a `providers.ProfileOrder`: tried like the default
    order, so a provider this onnxruntime lacks is skipped without a warning (the user did not ask
    for it). An explicit target order is the draft's too unless the draft has its own. `online`: the cores online
    where the engine runs (online_cores()); the profile's thread count is never above it (an explicit one is
    the user's)."""
    if profile is None:
        return {"providers": providers, "draft_providers": draft_providers, "threads": threads}
    return {
        "providers": providers if providers is not None else ProfileOrder(profile.providers),
        "draft_providers": draft_providers if draft_providers is not None else (
            providers if providers is not None else ProfileOrder(profile.draft_providers)),
        "threads": threads if threads is not None else clamp_threads(profile.default_threads, online),
    }


def with_measured_memory(profile: DeviceProfile, root: str | os.PathLike = "/") -> DeviceProfile:
    """The profile with the memory the kernel reports (<root>/proc/meminfo MemTotal) when the
    profile has no size of its own (a Pi 4 ships with 1, 2, 4 or 8 GB) or when `root` is that very
    board (an "8 GB" Orin Nano has 7.3 GiB for Linux); the default budget follows from it.

    `profile.detected["memory_source"]` says where the number came from: "measured" (with
    "memory_measured_on": the board read), "profile", or "unknown" when neither has one."""
    p = copy.deepcopy(profile)
    if p.detected.get("how"):  # detect() made it: memory_bytes is already the kernel's number
        return p
    p.default_threads = clamp_threads(p.default_threads, online_cores(root))  # the engine runs here
    total = meminfo(root).get("MemTotal")
    here = None
    if total:
        try:
            here = detect(root)
        except Exception:  # a detection problem must not stop a plan for a named board
            here = None
    on_board = here is not None and here.id == p.id
    if total and (p.memory_bytes is None or on_board):
        p.memory_bytes = int(total)
        p.detected["memory_source"] = "measured"
        p.detected["memory_measured_on"] = "this board" if on_board else (
            here.name if here is not None else "this machine")
    else:
        p.detected["memory_source"] = "profile" if p.memory_bytes else "unknown"
    return p
