"""What kind of CPU a bundle's form was tuned on (`edgespec tune`, recorded in manifest.extra["tuned"]),
and one line when this machine is another kind.

The tuner keeps the form whose 1-token step was fastest here; which form that is follows the CPU's
kernels (int8 dot products with VNNI or without, AVX-512 or AVX2, NEON dotprod / i8mm on ARM), so a
bundle carried to a different CPU still runs correctly but may no longer run its fastest form. The
kind is the model name and the kernel-relevant flags: the core count changes the timings, not which
kernels run, so it is recorded but not compared.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

# /proc/cpuinfo flags that select onnxruntime's MatMulNBits / int8 GEMM kernels (x86 and ARM)
KERNEL_FLAGS = ("avx2", "avx_vnni", "asimd", "asimddp", "dotprod", "i8mm")
KERNEL_FLAG_PREFIXES = ("avx512",)


def _kernel_flags(words: list[str]) -> list[str]:
    return sorted({w for w in words if w in KERNEL_FLAGS or w.startswith(KERNEL_FLAG_PREFIXES)})


def machine(root: str | os.PathLike = "/") -> dict[str, Any]:
    """{"cpu": model name, "flags": the kernel flags, "cores": logical CPUs} of this machine (read from
    <root>/proc/cpuinfo; unknown parts are None / [])."""
    try:
        text = (Path(root) / "proc/cpuinfo").read_text(errors="replace")
    except OSError:
        text = ""
    name = re.search(r"^(model name|Model|Hardware)\s*:\s*(.+)$", text, flags=re.M)
    flags = re.search(r"^(flags|Features)\s*:\s*(.+)$", text, flags=re.M)
    cores = len(re.findall(r"^processor\s*:", text, flags=re.M)) or os.cpu_count()
    return {"cpu": name.group(2).strip() if name else None,
            "flags": _kernel_flags(flags.group(2).split()) if flags else [], "cores": cores}


def tuned_elsewhere(extra: dict[str, Any], here: dict[str, Any] | None = None) -> str | None:
    """One line when the bundle was tuned on another kind of CPU than `here` (default: this machine);
    None when it was not tuned, or was tuned on this kind."""
    tuned = (extra or {}).get("tuned")
    if not isinstance(tuned, dict) or not isinstance(tuned.get("machine"), dict):
        return None
    then, now = tuned["machine"], here or machine()
    if then.get("cpu") == now.get("cpu") and sorted(then.get("flags") or []) == sorted(now.get("flags") or []):
        return None
    differs = [f"{then.get('cpu') or 'unknown CPU'} ({' '.join(then.get('flags') or []) or 'no kernel flags'})",
               f"{now.get('cpu') or 'unknown CPU'} ({' '.join(now.get('flags') or []) or 'no kernel flags'})"]
    return (f"tuned on another kind of CPU: {differs[0]}, this one is {differs[1]}; its form "
            f"({tuned.get('chosen', '?')}) may not be the fastest here: re-tune with "
            "`edgespec tune BUNDLE --gguf MODEL.gguf`")


def bundle_note(bundle: str | os.PathLike) -> str | None:
    """tuned_elsewhere for a bundle folder (its manifest.json read as JSON); None when it cannot be read
    (verify names that problem itself)."""
    import json

    try:
        extra = json.loads((Path(bundle) / "manifest.json").read_text(encoding="utf-8")).get("extra")
    except (OSError, ValueError, AttributeError):
        return None
    return tuned_elsewhere(extra if isinstance(extra, dict) else {})
