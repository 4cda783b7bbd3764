"""What the running system does to the memory and clocks a model gets, read from files under a `root` (the live
system, or a fake tree in tests): swap and zram, the CPU frequency governor, a running desktop and its memory,
the OS release, and a Jetson's nvpmodel modes (the board's own /etc/nvpmodel.conf and the mode it booted in).
`edgespec doctor` reports each with the command that changes it; nothing here changes anything.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from . import releases

# processes of a graphical session: display managers, X and Wayland compositors (comm, as /proc/PID/comm has it)
DESKTOP = ("gdm3", "gdm", "gdm-session-wor", "lightdm", "sddm", "Xorg", "Xwayland", "gnome-shell", "labwc",
           "wayfire", "mutter", "weston", "lxsession", "lxpanel", "pcmanfm", "nautilus", "unity-greeter")
DESKTOP_OFF = "sudo systemctl set-default multi-user.target && sudo reboot   (graphical.target brings it back)"
GOVERNOR_FAST = "echo performance | sudo tee /sys/devices/system/cpu/cpu*/cpufreq/scaling_governor"
NVPMODEL_STATUS = "var/lib/nvpmodel/status"  # "pmode:0002 fmode:..." (the mode nvpmodel last set)


def _read(root: Path, rel: str) -> str | None:
    try:
        return (root / rel).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def os_release(root: str | os.PathLike = "/") -> dict[str, str]:
    """/etc/os-release as a dict (ID, VERSION_CODENAME, PRETTY_NAME...), empty where there is none."""
    out = {}
    for line in (_read(Path(root), "etc/os-release") or "").splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip():
            out[key.strip()] = value.strip().strip('"')
    return out


def swaps(root: str | os.PathLike = "/") -> list[dict]:
    """/proc/swaps: one {"name", "type", "size_bytes", "used_bytes", "zram"} per active swap area."""
    out = []
    for line in (_read(Path(root), "proc/swaps") or "").splitlines()[1:]:
        f = line.split()
        if len(f) >= 4 and f[2].isdigit() and f[3].isdigit():
            out.append({"name": f[0], "type": f[1], "size_bytes": int(f[2]) * 1024, "used_bytes": int(f[3]) * 1024,
                        "zram": "/zram" in f[0]})
    return out


def zram_devices(root: str | os.PathLike = "/") -> list[dict]:
    """/sys/block/zram*: {"name", "disksize_bytes"} per configured device (swap or not)."""
    out = []
    for d in sorted(Path(root, "sys/block").glob("zram*")):
        size = (_read(d, "disksize") or "").strip()
        out.append({"name": d.name, "disksize_bytes": int(size) if size.isdigit() else None})
    return out


def governors(root: str | os.PathLike = "/") -> dict[str, int]:
    """CPU frequency governor -> how many cores use it (cpufreq's scaling_governor), empty without cpufreq."""
    out: dict[str, int] = {}
    for f in sorted(Path(root, "sys/devices/system/cpu").glob("cpu[0-9]*/cpufreq/scaling_governor")):
        g = (_read(f.parent, f.name) or "").strip()
        if g:
            out[g] = out.get(g, 0) + 1
    return out


def desktop(root: str | os.PathLike = "/") -> list[dict]:
    """Running processes of a graphical session, {"pid", "name", "rss_bytes"} each (VmRSS; 0 where unreadable)."""
    out = []
    for d in Path(root, "proc").glob("[0-9]*"):
        name = (_read(d, "comm") or "").strip()
        if name not in DESKTOP:
            continue
        m = re.search(r"^VmRSS:\s*(\d+)\s*kB", _read(d, "status") or "", flags=re.M)
        out.append({"pid": int(d.name), "name": name, "rss_bytes": int(m.group(1)) * 1024 if m else 0})
    return sorted(out, key=lambda p: p["pid"])


def nvpmodel_conf(root: str | os.PathLike = "/") -> dict | None:
    """The board's /etc/nvpmodel.conf: {"modes": [{"id", "name", "watts"}], "default": id}, None without one.
    Watts come from a name like "15W" (None for MAXN and the like: uncapped)."""
    text = _read(Path(root), "etc/nvpmodel.conf")
    if text is None:
        return None
    modes = []
    for m in re.finditer(r"<\s*POWER_MODEL\s+ID\s*=\s*(\d+)\s+NAME\s*=\s*([^\s>]+)\s*>", text):
        w = re.fullmatch(r"(\d+)W", m.group(2))
        modes.append({"id": int(m.group(1)), "name": m.group(2), "watts": int(w.group(1)) if w else None})
    d = re.search(r"<\s*PM_CONFIG\s+DEFAULT\s*=\s*(\d+)\s*>", text)
    return {"modes": modes, "default": int(d.group(1)) if d else None}


def nvpmodel_status(root: str | os.PathLike = "/") -> int | None:
    """The mode nvpmodel last set (/var/lib/nvpmodel/status "pmode:0002"), None where the file says nothing."""
    m = re.search(r"pmode:\s*0*(\d+)", _read(Path(root), NVPMODEL_STATUS) or "")
    return int(m.group(1)) if m else None


def fastest(modes: list[dict]) -> dict | None:
    """The mode with the most headroom: a MAXN one (uncapped) first, else the most watts."""
    if not modes:
        return None
    return max(modes, key=lambda m: (m["name"].upper().startswith("MAXN"), m.get("watts") or 0))


def power_modes(profile, root: str | os.PathLike, l4t: str | None) -> dict:
    """The modes this board can be put in, where they come from, and the fastest with its command.

    The board's /etc/nvpmodel.conf is the truth where it is there; otherwise the profile's sets that the JetPack
    release can have (the Super set only with the Super flash config, which the report says)."""
    conf = nvpmodel_conf(root)
    if conf and conf["modes"]:
        sets = {"this board": conf["modes"]}
        source = "/etc/nvpmodel.conf"
    else:
        row = releases.jetpack_row(l4t) if l4t else None
        wanted = row["power_modes"] if row else list(profile.power_modes)
        sets = {s: profile.power_modes[s] for s in wanted if s in profile.power_modes}
        source = f"the {profile.id} profile" + (f" for JetPack {row['jetpack']}" if row else "")
    out: dict = {"source": source, "sets": sets, "default": conf["default"] if conf else None, "fastest": {}}
    notes = releases.table()["power_mode_sets"]
    for name, modes in sets.items():
        best = fastest(modes)
        if best:
            out["fastest"][name] = {**best, "command": f"sudo nvpmodel -m {best['id']}",
                                    **({"needs": notes[name]} if name == "super" else {})}
    return out


def swap_advice(family: str, codename: str | None) -> dict:
    """How swap is set up on this OS and the line that makes a swap area persistent (the release table's)."""
    t = releases.table()
    if family == "jetson":
        return dict(t["jetson_swap"])
    row = releases.pi_os(codename) if family == "raspberrypi" else None
    if row:
        return {"swap": row["swap"], "swap_persist": row["swap_persist"]}
    return {"swap": "/etc/fstab", "swap_persist": t["jetson_swap"]["swap_persist"]}
