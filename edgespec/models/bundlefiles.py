"""A bundle's files on disk, read as untrusted: the manifest parsed under a guard, every listed file
inside the bundle folder (a symbolic link may point within the bundle, never out of it), of its
size and sha256, and nothing unlisted beside them.

A symlink out of the bundle would let a bundle that verifies make the runtime read any file the
service can read (`tokenizer_config.json -> /etc/passwd`), so it is refused, naming the path, before
anything is opened through it.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

MAX_MANIFEST_BYTES = 4 << 20  # real manifests are a few KB; a bigger one is not parsed at all


def read_json(path: Path, max_bytes: int = MAX_MANIFEST_BYTES) -> tuple[Any, str | None]:
    """(parsed JSON, None) or (None, one line saying why not): never a traceback, whatever the
    bytes (200,000 '[' is a RecursionError inside json, a 5,000-digit integer a ValueError)."""
    try:
        size = path.stat().st_size
        if size > max_bytes:
            return None, f"{path.name}: {size:,} bytes, over the {max_bytes:,} this edgespec reads"
        raw = path.read_bytes()
        return json.loads(raw.decode("utf-8")), None
    except RecursionError:
        return None, f"{path.name}: unreadable JSON: nested too deeply"
    except UnicodeDecodeError as e:
        return None, f"{path.name}: unreadable JSON: not UTF-8 text (byte {e.start})"
    except ValueError as e:  # JSONDecodeError, or Python's limit on the digits of an integer
        return None, f"{path.name}: unreadable JSON: {str(e).splitlines()[0][:200]}"
    except OSError as e:
        return None, f"{path.name}: cannot be read: {e.strerror or e}"


def outside(root_real: Path, path: Path) -> Path | None:
    """Where `path` really leads when that is outside the (resolved) bundle folder, else None."""
    real = Path(os.path.realpath(path))
    return None if real == root_real or root_real in real.parents else real


def file_problems(root: Path, files: dict[str, dict], checksums: bool, sha256: Callable[[Path], str]) -> list[str]:
    """Each listed file: inside the bundle, a regular file, of the listed size and (checksums) sha256."""
    root_real = Path(os.path.realpath(root))
    out = []
    for rel, entry in files.items():
        f = root / rel
        away = outside(root_real, f)
        if away is not None:
            out.append(f"{rel}: a symbolic link out of the bundle (to {away}): refused")
            continue
        if not f.is_file():
            out.append(f"{rel}: missing" if not f.exists() else f"{rel}: not a regular file")
            continue
        size = f.stat().st_size
        if size != entry["size"]:
            out.append(f"{rel}: size {size} bytes, manifest says {entry['size']}")
            continue
        if checksums:
            got = sha256(f)
            if got != entry["sha256"]:
                out.append(f"{rel}: sha256 {got[:16]}… does not match the manifest's {entry['sha256'][:16]}…")
    return out


def stray_problems(root: Path, listed: set[str]) -> list[str]:
    """Anything in the bundle folder the manifest does not list (links included, not followed)."""
    out = []
    for folder, dirs, names in os.walk(root, followlinks=False):
        here = Path(folder)
        linked = [d for d in dirs if (here / d).is_symlink()]  # walked into by no one: named here
        for name in sorted([*names, *linked]):
            rel = (here / name).relative_to(root).as_posix()
            if rel not in listed and not any(x.startswith(rel + "/") for x in listed):
                out.append(f"{rel}: present but not listed in the manifest")
        dirs.sort()
    return sorted(out)
