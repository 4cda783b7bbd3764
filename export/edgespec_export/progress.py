"""Progress bars and peak memory for the export.

The heavy steps may run in a child process (see isolate.py), which cannot draw on the user's
terminal cleanly while the parent also does; so every step reports through the small `Progress`
interface: in-process it draws tqdm bars on stderr, in a child it sends events to the parent, which
draws them (EventRenderer). The child's own noise (the builder's prints, transformers' warnings) never reaches
the terminal.
"""
from __future__ import annotations

import os
import sys
import threading
from contextlib import contextmanager
from typing import Iterator, Protocol


class Stage(Protocol):
    def update(self, n: int = 1) -> None: ...


class Progress(Protocol):
    def stage(self, name: str, total: int | None, unit: str = "it"):  # context manager yielding a Stage
        ...

    def note(self, message: str) -> None: ...


class _NullStage:
    def update(self, n: int = 1) -> None:
        pass


class NullProgress:
    @contextmanager
    def stage(self, name: str, total: int | None, unit: str = "it") -> Iterator[_NullStage]:
        yield _NullStage()

    def note(self, message: str) -> None:
        pass


class TqdmProgress:
    """Bars on stderr (or `file`); `enabled=False` keeps only the notes."""

    def __init__(self, file=None, enabled: bool = True):
        self.file = file or sys.stderr
        self.enabled = enabled
        self.notes: list[str] = []

    @contextmanager
    def stage(self, name: str, total: int | None, unit: str = "it"):
        if not self.enabled:
            yield _NullStage()
            return
        from tqdm import tqdm

        bar = tqdm(total=total, desc=f"{name:<24}", unit=unit, file=self.file, leave=True, dynamic_ncols=True,
                   mininterval=0.5, bar_format=None if total else "{desc} {n_fmt} {unit} [{elapsed}]")
        try:
            yield bar
        finally:
            bar.close()

    def note(self, message: str) -> None:
        self.notes.append(message)
        print(f"note: {message}", file=self.file, flush=True)


class EventRenderer:
    """Parent side: turns a child's events into bars of the parent's Progress."""

    def __init__(self, progress: Progress):
        self.progress = progress
        self.open: dict[int, tuple] = {}

    def handle(self, event: tuple) -> None:
        kind = event[0]
        if kind == "stage":
            _, sid, name, total, unit = event
            cm = self.progress.stage(name, total, unit)
            self.open[sid] = (cm, cm.__enter__())
        elif kind == "update":
            _, sid, n = event
            if sid in self.open:
                self.open[sid][1].update(n)
        elif kind == "end":
            cm_bar = self.open.pop(event[1], None)
            if cm_bar:
                cm_bar[0].__exit__(None, None, None)
        elif kind == "note":
            self.progress.note(event[1])

    def close(self) -> None:
        for cm, _bar in self.open.values():
            cm.__exit__(None, None, None)
        self.open.clear()


class MemoryMonitor:
    """Samples the resident memory of this process plus all its descendants (the children that load
    and build the models), and keeps the peak: that sum is what the machine has to hold."""

    def __init__(self, interval: float = 0.2):
        self.interval = interval
        self.peak_tree = 0
        self.peak_single = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> int:
        try:
            import psutil
        except ImportError:  # pragma: no cover - part of the export extra
            return 0
        me = psutil.Process(os.getpid())
        total = 0
        for p in [me] + me.children(recursive=True):
            try:
                rss = p.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            total += rss
            self.peak_single = max(self.peak_single, rss)
        self.peak_tree = max(self.peak_tree, total)
        return total

    def __enter__(self) -> "MemoryMonitor":
        self.sample()
        self._thread = threading.Thread(target=self._run, daemon=True, name="edgespec-memory")
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()
        self.sample()


def tune_malloc() -> None:
    """Let freed weights leave the process. The float weights freed one by one during quantization
    are 10-55 MB blocks; glibc raises its mmap threshold (up to 32 MB) as big blocks are freed, and
    blocks below it live in the heap, where freed space between live blocks stays counted in RSS. A
    fixed 1 MB threshold makes each weight-sized block its own mapping, returned when freed. (The big
    +3 GB found while measuring the 1.5B was something else: see quantize._detached.)"""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD (fixed: disables the dynamic raise)
        libc.mallopt(-1, 64 << 20)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):  # not glibc: nothing to tune
        pass


def trim_malloc() -> None:
    """Return free heap pages to the system now (glibc's malloc_trim; no-op elsewhere)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
