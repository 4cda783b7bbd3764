"""`edgespec doctor`: what this board is, what it has, what really works, and what to set.

Everything is read under a `root` (the live system by default, a fake tree in tests) and every
provider is tried with a tiny real session (providers.probe), because a provider that onnxruntime
lists can still fail to run. Where a provider is missing, the report says how to get it on this
board (from the device profile's `install` hints: on a Jetson, NVIDIA's onnxruntime-gpu wheel).
"""
from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Any

from . import boardstate, devices, providers, releases, sensors
from ..models.kernels import ORT_FLOORS, floor_problem
from ..units import format_size

GPU_LIB_GLOBS = {
    "cuda": ("usr/local/cuda*/lib64/libcudart.so*", "usr/local/cuda*/targets/*/lib/libcudart.so*",
             "usr/lib/*-linux-gnu/libcudart.so*"),
    "tensorrt": ("usr/lib/*-linux-gnu/libnvinfer.so*", "usr/local/tensorrt*/lib/libnvinfer.so*"),
}


def onnxruntime_install(profile, board: dict[str, Any]) -> str:
    """The line that installs the onnxruntime this board should have: on a Jetson, what its JetPack release's row
    in devices/_releases.json says (NVIDIA's onnxruntime-gpu fetched alone from its index, or the CPU wheel with the
    reason there is no GPU one); the CPU wheel elsewhere (never the CPU wheel on a Jetson that could take the GPU
    one: both own the `onnxruntime` module)."""
    cpu = "pip install 'edgespec[cpu]'"
    l4t = board.get("tegra_release")
    if profile.family != "jetson" and not l4t:
        return cpu
    if l4t is None:  # a Jetson profile named on another machine: the supported JetPack 6 line
        sid, src = "jp6-cu126", releases.table()["onnxruntime"]["jp6-cu126"]
        return releases.gpu_install_line(src) + "   (JetPack 6.1 to 6.2.2; docs/jetson.md)"
    sid, src = releases.onnxruntime_source(l4t)
    name = releases.jetpack_name(l4t) or "a JetPack edgespec does not know"
    if sid == "jp6-cu126":
        return releases.gpu_install_line(src) + f"   ({name}, L4T {l4t}; docs/jetson.md)"
    return f"{cpu}   ({name}, L4T {l4t}: {src['what']}; docs/jetson.md)"


def release_info(profile, board: dict[str, Any], root: Path) -> dict[str, Any]:
    """The board's software release from the release table: a Jetson's JetPack row (by L4T), a Pi's OS row."""
    l4t = board.get("tegra_release")
    if l4t:
        row = releases.jetpack_row(l4t)
        sid, src = releases.onnxruntime_source(l4t)
        return {"kind": "jetpack", "l4t": l4t, "name": releases.jetpack_name(l4t), "row": row,
                "onnxruntime_source": sid, "onnxruntime_what": src["what"]}
    osr = boardstate.os_release(root)
    row = releases.pi_os(osr.get("VERSION_CODENAME")) if profile.family == "raspberrypi" else None
    return {"kind": "os", "name": osr.get("PRETTY_NAME"), "codename": osr.get("VERSION_CODENAME"), "row": row}


def system_state(profile, root: Path, codename: str | None) -> dict[str, Any]:
    """Swap and zram, the CPU governor and a running desktop, each with the command that changes it."""
    desk = boardstate.desktop(root)
    advice = boardstate.swap_advice(profile.family, codename)
    return {"swap": boardstate.swaps(root), "zram": boardstate.zram_devices(root), "swap_setup": advice["swap"],
            "swap_persist": advice["swap_persist"], "zram_off": advice.get("zram_off"),
            "governors": boardstate.governors(root), "governor_command": boardstate.GOVERNOR_FAST,
            "desktop": desk, "desktop_rss_bytes": sum(p["rss_bytes"] for p in desk),
            "desktop_command": boardstate.DESKTOP_OFF}


def _nvidia_gpu(root: Path, profile) -> bool:
    """An NVIDIA GPU the CUDA provider could use: any Jetson, or a desktop driver's traces."""
    if profile.family == "jetson":
        return True
    return (root / "proc/driver/nvidia/version").exists() or bool(glob.glob(str(root / "dev/nvidia[0-9]*")))


def _libs(root: Path) -> dict[str, list[str]]:
    found = {}
    for name, pats in GPU_LIB_GLOBS.items():
        hits: list[str] = []
        for pat in pats:
            hits += sorted(glob.glob(str(root / pat)))
        found[name] = ["/" + os.path.relpath(h, root) for h in hits[:3]]
    return found


def collect(root: str | os.PathLike = "/", *, device=None, path: str | None = None, probe: bool = True) -> dict[str, Any]:
    """The whole report as plain data (what `doctor --json` prints)."""
    root = Path(root)
    if device in (None, "auto"):
        profile = devices.detect(root)
    else:  # a named board: its memory is the kernel's when it has no size of its own or this is that board
        profile = devices.with_measured_memory(devices.resolve(device), root)
    board = devices.read_board(root)
    report: dict[str, Any] = {"board": profile.to_dict()}
    if not profile.detected.get("how"):
        report["board"]["detected"] = {"how": f"--device {device}", **board, **profile.detected}
    mem_total = board.get("mem_total")
    report["memory"] = {
        "total_bytes": mem_total, "available_bytes": board.get("mem_available"),
        "profile_bytes": profile.memory_bytes, "source": profile.detected.get("memory_source"),
        "default_budget_bytes": profile.memory_budget_bytes, "shared_with_gpu": profile.memory_shared_with_gpu,
    }
    report["cpu"] = {"arch": board.get("arch"), "cores": board.get("cpu_count"), "model": board.get("cpu_model")}
    if str(root) == "/" and hasattr(os, "sched_getaffinity"):
        report["cpu"]["usable_cores"] = len(os.sched_getaffinity(0))

    # providers, tried for real
    try:
        import onnxruntime as ort

        ort_info = {"version": ort.__version__, "build_providers": list(ort.get_available_providers()),
                    "floors": dict(ORT_FLOORS),  # per graph flavor: onnxruntime-gpu lags the CPU wheel
                    "below_floor": {f: p for f in ORT_FLOORS if (p := floor_problem(ort.__version__, f))}}
    except ImportError as e:  # edgespec pulls no onnxruntime itself: say which one this board needs
        ort_info = {"version": None, "build_providers": [], "error": str(e),
                    "install": onnxruntime_install(profile, board)}
    report["onnxruntime"] = ort_info
    wanted = list(dict.fromkeys(profile.providers + profile.draft_providers + ["cpu"]))
    if probe:
        results = [r.to_dict() for r in providers.probe(wanted, profile=profile)]
    else:
        build = set(ort_info["build_providers"])
        results = [{"provider": providers.short_name(n), "name": n, "in_build": n in build, "works": None,
                    "error": None if n in build else "not in this onnxruntime build", "seconds": 0.0}
                   for n in providers.normalize(wanted)]
    report["providers"] = results
    report["gpu_libraries"] = _libs(root)

    # sensors, with a reading now
    found = sensors.discover(root, profile=profile, path=path)
    reading = found.read()
    report["sensors"] = {**found.describe(), "reading": reading.to_dict()}
    report["power_mode"] = _current_mode(found, root, profile)
    report["release"] = release_info(profile, board, root)
    report["install"] = onnxruntime_install(profile, board)
    if profile.family == "jetson":
        report["power_modes"] = boardstate.power_modes(profile, root, board.get("tegra_release"))
    report["system"] = system_state(profile, root, report["release"].get("codename"))
    report["throttling"] = _throttling(reading, found)

    report["missing"] = _missing(root, profile, results, ort_info)
    report["provider_order"] = {"order": list(profile.providers), "why": provider_order_why(profile)}
    report["recommended"] = _recommend(profile, results, board)
    report["notes"] = list(profile.notes)
    return report


def _current_mode(found: sensors.Sensors, root: Path, profile) -> dict[str, Any] | None:
    """The nvpmodel mode now: `nvpmodel -q`, else the mode nvpmodel last set (its status file), named from the
    board's /etc/nvpmodel.conf."""
    mode = found.power_mode()
    if mode and mode.get("name"):
        return mode
    pid = boardstate.nvpmodel_status(root)
    if pid is None:
        return mode
    conf = boardstate.nvpmodel_conf(root) or {"modes": []}
    name = next((m["name"] for m in conf["modes"] if m["id"] == pid), None)
    return {"name": name or f"mode {pid}", "id": pid, "from": boardstate.NVPMODEL_STATUS}


def tensorrt_report(bundle_path: str | os.PathLike) -> list[dict[str, Any]]:
    """Per graph of a bundle: which nodes TensorRT's provider would take (kernels.TENSORRT_OPS) and
    which it leaves to CUDA or the CPU, by op. Read from the graphs, nothing is run."""
    from ..models.bundle import Bundle, resolve_bundle
    from ..models.graphfacts import read_graph_io
    from ..models.kernelcheck import tensorrt_split

    bundle = Bundle.open(resolve_bundle(bundle_path), verify=False)
    out = []
    for role, facts in bundle.manifest.models.items():
        for flavor, g in facts.graphs().items():
            taken, left = tensorrt_split(read_graph_io(bundle.root / g.path))
            out.append({"role": role, "flavor": flavor, "path": g.path, "tensorrt": taken, "not_tensorrt": left})
    return out


def _throttling(reading: sensors.Reading, found: sensors.Sensors) -> dict[str, Any]:
    if not found.has_throttle:
        return {"known": False, "now": [], "since_boot": []}
    bits = reading.throttle_bits
    return {"known": bits is not None, "bits": None if bits is None else hex(bits),
            "now": sensors.throttle_reasons(bits), "since_boot": sensors.throttle_reasons(bits, since_boot=True)}


def _works(results, short: str) -> bool:
    return any(r["provider"] == short and r["works"] for r in results)


def _missing(root: Path, profile, results, ort_info: dict[str, Any]) -> list[dict[str, str]]:
    """What a user should install, with how (only where the board could use it)."""
    if ort_info.get("version") is None:  # nothing runs: the one install line is all there is to say
        return [{"what": "onnxruntime", "why": "no onnxruntime is importable (edgespec installs none itself)",
                 "how": ort_info["install"]}]
    out = []
    gpu = _nvidia_gpu(root, profile)
    wanted = set(profile.providers) | set(profile.draft_providers)
    for short in [p for p in ("cuda", "tensorrt") if p in wanted]:  # cuda first: the TensorRT hint refers to it
        r = next((r for r in results if r["provider"] == short), None)
        if r is None or r["works"] or not gpu:
            continue
        if not r["in_build"]:
            how = profile.install.get("onnxruntime-gpu") or "pip install onnxruntime-gpu"
            l4t = devices.read_board(root).get("tegra_release")
            if l4t and releases.onnxruntime_source(l4t)[0] != "jp6-cu126":
                how = f"{releases.jetpack_name(l4t) or 'L4T ' + l4t}: {releases.onnxruntime_source(l4t)[1]['what']}"
            if short == "tensorrt" and not _libs(root)["tensorrt"]:
                how = profile.install.get("tensorrt", how)
            out.append({"what": short, "why": "this onnxruntime has no " + short.upper() + " provider "
                        "(the PyPI onnxruntime wheel is CPU-only)", "how": how})
        else:
            out.append({"what": short, "why": f"the provider is in this onnxruntime but failed: {r['error']}",
                        "how": "check the CUDA/TensorRT libraries match this onnxruntime-gpu build "
                               "(JetPack version); run with -v for onnxruntime's own message"})
    # not tried (--no-probe) is not known to be broken
    if not _works(results, "cpu") and not any(r["provider"] == "cpu" and r["works"] is None for r in results):
        out.append({"what": "cpu", "why": "onnxruntime cannot run even the CPU probe",
                    "how": "pip install --force-reinstall onnxruntime"})
    return out


TRT_WHY = ("TensorRT is left out: it has no GroupQueryAttention or MatMulNBits (com.microsoft ops), so onnxruntime "
           "gives those, and the fused norms, to CUDA node by node and TensorRT only the elementwise pieces between "
           "them, dozens of tiny engines that save nothing; the bundle's cuda-flavored graph runs on CUDA whole")


def provider_order_why(profile) -> str:
    """Why this board's default provider order is what it is (docs/edge.md, "TensorRT")."""
    order = list(profile.providers)
    if "cuda" in order:
        why = ("CUDA first: export the bundle with --ep cuda (float16 attention and KV cache, the only "
               "GroupQueryAttention CUDA has); the CPU after it for a board without a working CUDA")
        return why + ("; " + TRT_WHY if "tensorrt" not in order else "")
    return "CPU only: no NVIDIA GPU on this board"


def _recommend(profile, results, board) -> dict[str, Any]:
    working = [p for p in profile.providers if _works(results, p)] or ["cpu"]
    draft = [p for p in profile.draft_providers if _works(results, p)] or ["cpu"]
    cores = board.get("cpu_count") or profile.cpu_cores
    rec: dict[str, Any] = {
        "device": profile.id,
        "providers": ",".join(working),
        "draft_providers": ",".join(draft),
        "threads": profile.default_threads or cores,
        "max_len": profile.default_max_len,
    }
    budget = profile.memory_budget_bytes
    rec["memory_budget_from"] = "profile"
    if budget is None and board.get("mem_available"):
        # a profile without a size (generic, Pi 4) sets no budget itself: suggest one from what is free now,
        # a fifth left for what starts later
        budget = int(board["mem_available"] * 0.8)
        rec["memory_budget_from"] = "available"
    if budget:
        rec["memory_budget"] = _size_flag(budget)
    if profile.family == "raspberrypi":
        rec["max_temp"] = "80C"  # the firmware starts capping the clock at 80-85 C: slow down before it does
    return rec


def _size_flag(n: int) -> str:
    """A --memory-budget value rounded down to 0.25 GiB (or MiB below 1 GiB)."""
    gib = n / (1 << 30)
    if gib >= 1:
        return f"{int(gib * 4) / 4:g}GiB"
    return f"{int(n / (1 << 20))}MiB"


def render(report: dict[str, Any]) -> str:
    """The human-readable report."""
    lines: list[str] = []

    def row(key: str, text: str) -> None:
        for i, t in enumerate(text.splitlines() or [""]):
            lines.append(f"{key if i == 0 else '':<12} {t}")

    b = report["board"]
    det = b.get("detected", {})
    row("board", f"{b['name']} ({b['id']})\ndetected by {det.get('how', '?')}")
    rel = report.get("release") or {}
    if rel.get("kind") == "jetpack":
        r = rel.get("row")
        facts = f": Ubuntu {r['ubuntu']}, Python {r['python']}, CUDA {r['cuda']}" if r else ""
        row("", f"L4T {rel['l4t']} ({rel.get('name') or 'a JetPack edgespec does not know'}{facts})")
    elif rel.get("name"):
        r = rel.get("row")
        row("os", rel["name"] + (f" (Python {r['python']}, glibc {r['glibc']})" if r else ""))
    c = report["cpu"]
    usable = f", {c['usable_cores']} usable" if c.get("usable_cores") and c["usable_cores"] != c.get("cores") else ""
    row("cpu", f"{c.get('cores') or '?'} x {c.get('model') or 'unknown'} ({c.get('arch') or '?'}){usable}")
    m = report["memory"]
    mem = f"{format_size(m['total_bytes'])} total" if m.get("total_bytes") else "unknown"
    if m.get("available_bytes"):
        mem += f", {format_size(m['available_bytes'])} available"
    if m.get("profile_bytes") and m.get("source") == "profile":
        mem += f"; the {b['id']} profile has {format_size(m['profile_bytes'])}"
    if m.get("default_budget_bytes"):
        mem += f"; default budget {format_size(m['default_budget_bytes'])}"
        if m.get("source") == "measured":
            on = det.get("memory_measured_on")
            mem += (" (from the measured memory)" if on in (None, "this board") else
                    f" (from this machine's memory: the {b['id']} profile has no size of its own)")
    if m.get("shared_with_gpu"):
        mem += " (shared with the GPU)"
    row("memory", mem)
    o = report["onnxruntime"]
    version = o["version"] or f"not importable: {o.get('error')}"
    floors = o.get("floors") or {}
    if floors:
        version += " (edgespec needs " + ", ".join(f">= {v} for the {f} flavor" for f, v in floors.items()) + ")"
    for f, problem in (o.get("below_floor") or {}).items():
        version += f"\nTOO OLD for the {f} flavor: {problem}"
    row("onnxruntime", version)
    prov = []
    for r in report["providers"]:
        if r["works"]:
            state = f"works ({r['seconds'] * 1000:.0f} ms probe)"
        elif r["works"] is None:
            state = "in this build (not tried)" if r["in_build"] else "missing"
        elif not r["in_build"]:
            state = "missing: not in this onnxruntime build"
        else:
            state = f"FAILED: {r['error']}"
        prov.append(f"{r['provider']:<9} {state}")
    row("providers", "\n".join(prov))
    s = report["sensors"]
    rd = s["reading"]
    sens = []
    if rd.get("power_w") is not None:
        rails = ", ".join(f"{k} {v:.2f} W" for k, v in rd["rails_w"].items())
        scope = rd.get("power_scope") or "power"
        what = "board power" if scope == "board input" else f"power ({scope})"
        if scope == "core rails":
            what = "power (core rails: the PMIC's rails, not the 5 V input, which reads a voltage only)"
        sens.append(f"{what} {rd['power_w']:.2f} W" + (f" ({rails})" if rails else ""))
    elif s["power_rails"]:
        sens.append("power: sensors found but unreadable")
    else:
        sens.append("power: no sensor (no watts, no J/token)")
    if rd.get("temp_c") is not None:
        zones = ", ".join(f"{k} {v:.1f}" for k, v in rd["temps_c"].items())
        sens.append(f"temperature {rd['temp_c']:.1f} C ({zones})")
    else:
        sens.append("temperature: no thermal zone")
    for e in rd.get("errors", []):
        sens.append(f"error: {e}")
    row("sensors", "\n".join(sens))
    pm = report.get("power_mode")
    if pm:
        row("power mode", f"{pm.get('name')} (nvpmodel mode {pm.get('id')})" if pm.get("name") else f"unknown ({pm.get('error')})")
    elif b.get("power_modes"):
        row("power mode", "unknown: nvpmodel not found")
    modes = report.get("power_modes")
    if modes:
        lines_ = []
        for name, ms in modes["sets"].items():
            lines_.append(f"{name}: " + ", ".join(f"{m['id']} = {m['name']}" for m in ms))
            best = modes["fastest"].get(name)
            if best:
                lines_.append(f"  fastest: {best['command']} ({best['name']})" + (f"; {best['needs']}" if best.get("needs") else ""))
        row("modes", "\n".join(lines_) + f"\n(from {modes['source']})")
    sysinfo = report.get("system")
    if sysinfo:
        sw = sysinfo["swap"]
        text = ", ".join(f"{s_['name']} {format_size(s_['size_bytes'])}" + (" (zram)" if s_["zram"] else "")
                         + (f", {format_size(s_['used_bytes'])} used" if s_["used_bytes"] else "") for s_ in sw) or "none"
        row("swap", f"{text}; set up by {sysinfo['swap_setup']}\nto add swap that survives a reboot: {sysinfo['swap_persist']}"
            + (f"\nzram off: {sysinfo['zram_off']}" if sysinfo.get("zram_off") and any(s_["zram"] for s_ in sw) else ""))
        gov = sysinfo["governors"]
        if gov:
            row("governor", ", ".join(f"{g} ({n} cores)" for g, n in gov.items())
                + ("" if set(gov) == {"performance"} else f"\nsteadier step times: {sysinfo['governor_command']}"))
        desk = sysinfo["desktop"]
        if desk:
            row("desktop", ", ".join(p["name"] for p in desk) + f" running: {format_size(sysinfo['desktop_rss_bytes'])}"
                f" resident\nfor a service: {sysinfo['desktop_command']}")
        else:
            row("desktop", "none running")
    if report.get("install"):
        row("install", f"onnxruntime for this board: {report['install']}")
    t = report["throttling"]
    if t["known"]:
        now = ", ".join(t["now"]) or "none"
        since = ", ".join(t["since_boot"]) or "none"
        row("throttling", f"now: {now}; since boot: {since} ({t['bits']})")
    rec = report["recommended"]
    flags = [f"--device {rec['device']}", f"--providers {rec['providers']}"]
    if rec["draft_providers"] != rec["providers"]:
        flags.append(f"--draft-providers {rec['draft_providers']}")
    if rec.get("threads"):
        flags.append(f"--threads {rec['threads']}")
    if rec.get("memory_budget"):
        flags.append(f"--memory-budget {rec['memory_budget']}")
    flags.append(f"--max-len {rec['max_len']}")
    if rec.get("max_temp"):
        flags.append(f"--max-temp {rec['max_temp']}")
    row("recommended", " ".join(flags))
    if rec.get("memory_budget") and rec.get("memory_budget_from") == "available":
        row("", f"--memory-budget {rec['memory_budget']}: 80 % of the {format_size(report['memory']['available_bytes'])} available "
                f"now; the {rec['device']} profile has no budget of its own, so pass it (it is not applied by default)")
    po = report.get("provider_order")
    if po:
        row("provider order", f"{','.join(po['order'])}: {po['why']}")
    for miss in report["missing"]:
        row("missing", f"{miss['what']}: {miss['why']}\nhow: {miss['how']}")
    for t in report.get("tensorrt_nodes", []):
        n_in, n_out = sum(t["tensorrt"].values()), sum(t["not_tensorrt"].values())
        rest = ", ".join(f"{op} x{n}" for op, n in sorted(t["not_tensorrt"].items(), key=lambda kv: -kv[1]))
        row("tensorrt", f"{t['path']} ({t['flavor']}): TensorRT would take {n_in} of {n_in + n_out} nodes "
                        f"({', '.join(sorted(t['tensorrt']))})" + (f"; not: {rest}" if rest else "")
                        + (" (onnxruntime's own ops: not in onnx-tensorrt's operator list)" if rest else ""))
    for n in report.get("notes", []):
        row("note", n)
    for n in s.get("notes", []):
        row("note", n)
    return "\n".join(lines)
