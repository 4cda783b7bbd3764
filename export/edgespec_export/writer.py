"""Writing a bundle so that only a complete one can ever look valid.

Everything goes into `<out>.partial/`; manifest.json (with every file's sha256) is written last and
fsynced, then the folder is renamed to `<out>`. A crash, Ctrl-C or full disk leaves at most a
`.partial` folder, which has no manifest or fails `verify`; Ctrl-C and SIGTERM (the pipeline runs
under `sigterm_cleans_up`) leave nothing.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import os
import shutil
import signal
import threading
from pathlib import Path
from typing import Iterator

from edgespec import __version__
from edgespec.models.manifest import MANIFEST_NAME, Manifest, file_entry


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the export stands so that it unwinds like Ctrl-C does."""


# a SIGTERM that arrives while remove_partial runs waits for it to finish (it would cut the cleanup short)
_held = {"cleaning": False, "pending": False}


@contextlib.contextmanager
def sigterm_cleans_up() -> Iterator[None]:
    """SIGTERM's default action ends the process where it stands, skipping the cleanup that Ctrl-C's
    KeyboardInterrupt runs on its way out (the `.partial` folder removed, the model child killed).
    Inside this block SIGTERM raises Terminated instead; once the export has unwound, the signal is
    handed to the handler that was there before (by default the process then dies of SIGTERM, as a
    service manager expects). Only in the main thread, and not when SIGTERM is ignored or was set
    outside Python."""
    previous = signal.getsignal(signal.SIGTERM)
    if threading.current_thread() is not threading.main_thread() or previous in (signal.SIG_IGN, None):
        yield
        return

    def terminate(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one is enough; a second would cut the cleanup short
        if _held["cleaning"]:
            _held["pending"] = True  # raised by remove_partial once the folder is gone
            return
        raise Terminated()

    signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    except Terminated:
        signal.signal(signal.SIGTERM, previous)
        signal.raise_signal(signal.SIGTERM)
        raise  # the previous handler returned: the caller sees an interruption
    finally:
        signal.signal(signal.SIGTERM, previous)


def remove_partial(tmp: Path) -> None:
    """Removes an unfinished bundle's folder after a failure. A SIGTERM arriving meanwhile (a service
    manager signals the export and its model child together, and the child's death may be the failure
    being cleaned up) is raised only once the folder is gone."""
    _held["cleaning"] = True
    try:
        shutil.rmtree(tmp, ignore_errors=True)
    finally:
        _held["cleaning"] = False
    if _held["pending"]:
        _held["pending"] = False
        raise Terminated()


def partial_dir(out: Path) -> Path:
    return out.with_name(out.name + ".partial")


def start(out: Path, *, overwrite: bool) -> Path:
    """Returns a fresh, empty partial folder next to `out`."""
    from edgespec.errors import ExportError

    if out.exists() and not overwrite:
        raise ExportError(f"{out} already exists: pass --overwrite to replace it, or choose another -o")
    if out.exists() and not _replaceable(out):
        raise ExportError(
            f"{out} exists and is not an edgespec bundle (no manifest.json): refusing to replace it even with "
            "--overwrite; choose another -o"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = partial_dir(out)
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    return tmp


def _replaceable(out: Path) -> bool:
    """--overwrite replaces a bundle (or an empty folder), never some other folder the user pointed at."""
    if not out.is_dir():
        return False
    return (out / MANIFEST_NAME).is_file() or not any(out.iterdir())


def fill_file_table(manifest: Manifest, root: Path) -> None:
    manifest.files = {
        p.relative_to(root).as_posix(): file_entry(p)
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != MANIFEST_NAME
    }


def finish(manifest: Manifest, tmp: Path, out: Path) -> Path:
    """Checksums every file, writes the manifest last, fsyncs, and renames into place."""
    manifest.created_by = manifest.created_by or f"edgespec {__version__}"
    manifest.created_at = manifest.created_at or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    fill_file_table(manifest, tmp)
    manifest.digest = ""
    manifest.digest = manifest.compute_digest()
    for p in tmp.rglob("*"):
        if p.is_file():
            _fsync(p)
    mpath = tmp / MANIFEST_NAME
    with open(mpath, "w", encoding="utf-8") as f:
        f.write(manifest.to_json())
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(tmp)
    swap_into_place(tmp, out)
    _fsync_dir(out.parent)
    return out


def swap_into_place(tmp: Path, out: Path) -> None:
    """Renames a finished folder onto `out` (an old one moved aside first, then removed): a reader sees
    the old folder or the new one, never half of one (bundles, embedder folders)."""
    if out.exists():
        old = out.with_name(out.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    try:
        _fsync(path)
    except OSError:  # some filesystems refuse directory fsync; the rename is still atomic
        pass
