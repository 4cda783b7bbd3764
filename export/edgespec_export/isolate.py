"""Run one heavy step in a fresh child process, so its memory goes back to the system when it ends.

Loading, building and checking a model needs the float weights in memory; a Python process that
frees them rarely returns all of it (allocator fragmentation, torch's caches), so exporting the target
and then the draft in one process costs the sum, not the larger. A child per model costs the larger,
and isolates the builder's global state too.

The child is `python -m edgespec_export.isolate JOB RESULT` (not multiprocessing's spawn, which
re-imports the caller's main script). It gets the pickled call in JOB, reports progress as JSON lines
on its stdout (its own prints and C-level output go to a log file instead), and leaves its pickled
result or exception in RESULT. It runs in its own session, so Ctrl-C reaches only the parent, which
kills it and cleans up; and it dies with the parent (PR_SET_PDEATHSIG), so it is never orphaned.
"""
from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from pathlib import Path
from typing import Any, Callable

from edgespec.errors import ExportError

from edgespec.units import peak_rss_bytes

from .progress import EventRenderer, Progress


def call(fn: Callable[..., Any], *args, progress: Progress, isolate: bool = True, what: str = "",
         log_dir: Path | None = None, stats: dict | None = None, **kwargs) -> Any:
    """fn(*args, progress=..., **kwargs), in a child process when `isolate`. `fn` must be a
    module-level function and its arguments and result picklable. `stats`, if given, receives
    {"peak_rss": bytes} of the process that ran it."""
    if not isolate:
        result = fn(*args, progress=progress, **kwargs)
        if stats is not None:
            stats["peak_rss"] = peak_rss_bytes()
        return result
    if log_dir is None:
        clean_stale()
    with tempfile.TemporaryDirectory(prefix=PREFIX, dir=log_dir) as tmp:
        job, result, log = Path(tmp) / "job.pkl", Path(tmp) / "result.pkl", Path(tmp) / "child.log"
        (Path(tmp) / OWNER).write_text(str(os.getpid()))
        job.write_bytes(pickle.dumps((fn, args, kwargs)))
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        proc = subprocess.Popen(
            [sys.executable, "-m", "edgespec_export.isolate", str(job), str(result), str(log)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True, env=env,
        )
        renderer = EventRenderer(progress)
        stray: list[str] = []
        try:
            assert proc.stdout is not None
            for raw in proc.stdout:
                line = raw.decode("utf-8", errors="replace").rstrip("\n")
                if line.startswith("@@edgespec "):
                    renderer.handle(tuple(json.loads(line[len("@@edgespec "):])))
                elif line:
                    stray.append(line)
            code = proc.wait()
        finally:
            renderer.close()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if result.exists():
            status, payload, tb, peak = pickle.loads(result.read_bytes())
            if stats is not None:
                stats["peak_rss"] = peak
            if status == "ok":
                return payload
            if isinstance(payload, BaseException):
                if not isinstance(payload, (ExportError, OSError)):
                    payload.add_note(f"(raised in the export child process)\n{tb}")
                raise payload
            raise ExportError(f"{what}: {payload}")
        tail = "\n".join((stray + _tail(log))[-15:])
        hint = " (killed: out of memory?)" if code in (-signal.SIGKILL, 137) else ""
        raise ExportError(f"{what or 'export step'} died with exit code {code}{hint}" + (f":\n{tail}" if tail else ""))


PREFIX = "edgespec-export-"
OWNER = "owner.pid"  # the parent's pid: a folder whose owner is gone is a killed export's leftover


def clean_stale(root: Path | None = None) -> list[Path]:
    """Removes `<tmp>/edgespec-export-*` folders left by an export that was killed (SIGKILL, power
    loss: no cleanup ran). Only those whose owner process is gone; returns what was removed.
    The pipeline keeps its job folders under `<out>.partial/.work` instead, which the next export
    of that bundle removes anyway; this covers other callers and older versions' leftovers."""
    root = Path(root or tempfile.gettempdir())
    removed = []
    for d in root.glob(PREFIX + "*"):
        try:
            pid = int((d / OWNER).read_text().strip())
        except (OSError, ValueError):
            continue  # not ours to judge (an older version's folder has no owner file)
        if pid == os.getpid() or _alive(pid):
            continue
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, another user's
    return True


def _tail(log: Path) -> list[str]:
    try:
        return log.read_text(errors="replace").splitlines()[-15:]
    except OSError:
        return []


class _LineProgress:
    """The child's Progress: events as JSON lines on the private channel."""

    def __init__(self, channel):
        self.channel = channel
        self._next = 0
        self._lock = threading.Lock()

    def emit(self, *event) -> None:
        with self._lock:
            self.channel.write("@@edgespec " + json.dumps(event) + "\n")
            self.channel.flush()

    @contextlib.contextmanager
    def stage(self, name: str, total: int | None, unit: str = "it"):
        self._next += 1
        sid = self._next
        self.emit("stage", sid, name, total, unit)
        stage = _BatchedStage(self, sid)
        try:
            yield stage
        finally:
            stage.flush()
            self.emit("end", sid)

    def note(self, message: str) -> None:
        self.emit("note", message)


class _BatchedStage:
    def __init__(self, progress: _LineProgress, sid: int):
        import time

        self.progress, self.sid, self.pending = progress, sid, 0
        self._time = time.monotonic
        self.last = self._time()

    def update(self, n: int = 1) -> None:
        self.pending += n
        now = self._time()
        if now - self.last > 0.2:
            self.flush()
            self.last = now

    def flush(self) -> None:
        if self.pending:
            self.progress.emit("update", self.sid, self.pending)
            self.pending = 0


def _die_with_parent() -> None:
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the parent still kills us on its way out
        pass


def _picklable(e: BaseException) -> BaseException | str:
    if isinstance(e, OSError) and e.errno == errno.ENOSPC:
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), getattr(e, "filename", None))
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:
        return f"{type(e).__name__}: {e}"


def child_main(job_path: str, result_path: str, log_path: str) -> int:
    _die_with_parent()
    # the private channel is the original stdout; fd 1 and 2 now go to the log
    channel = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", buffering=0), write_through=True)
    sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", buffering=0), write_through=True)
    progress = _LineProgress(channel)
    try:
        fn, args, kwargs = pickle.loads(Path(job_path).read_bytes())
        payload = fn(*args, progress=progress, **kwargs)
        out = ("ok", payload, "", peak_rss_bytes())
    except BaseException as e:  # noqa: BLE001 - everything goes back to the parent
        tb = traceback.format_exc()
        print(tb, file=sys.stderr)
        out = ("error", _picklable(e), tb, peak_rss_bytes())
    tmp = Path(result_path + ".tmp")
    tmp.write_bytes(pickle.dumps(out))
    os.replace(tmp, result_path)
    channel.flush()
    return 0


if __name__ == "__main__":
    sys.exit(child_main(*sys.argv[1:4]))
