"""Progress while a bundle loads (`generate`, `chat`): checking the files and loading the models take
seconds on a workstation and tens of seconds from a Pi's SD card, and a command that prints nothing for
that long looks hung. One line on stderr, redrawn in place with the seconds so far; only on a terminal
(a pipe or a log gets nothing) and never with --quiet. stdout stays the generated text alone.
"""
from __future__ import annotations

import sys
import threading
import time
from typing import Callable

TICK_S = 0.5  # how often the elapsed seconds are redrawn: often enough to look alive, rarely enough to cost nothing


class LoadProgress:
    """`with LoadProgress("qwen-coder") as p: p.stage("checking the bundle"); ...` draws
    `[loading qwen-coder] checking the bundle 3 s` and, at the end, `loaded qwen-coder in 9.8 s`.
    `tick`: seconds between redraws (0: redraw only when the stage changes, for tests)."""

    def __init__(self, name: str, *, quiet: bool = False, stream=None, tick: float = TICK_S,
                 clock: Callable[[], float] = time.monotonic):
        self.name = name
        self.stream = stream if stream is not None else sys.stderr
        self.on = not quiet and bool(getattr(self.stream, "isatty", lambda: False)())
        self.tick = tick
        self.clock = clock
        self.text = ""
        self._t0 = clock()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "LoadProgress":
        if self.on and self.tick > 0:
            self._thread = threading.Thread(target=self._run, name="edgespec-load-progress", daemon=True)
            self._thread.start()
        return self

    def stage(self, text: str) -> None:
        self.text = text
        self._draw()

    def __exit__(self, exc_type, exc, tb) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if not self.on:
            return
        with self._lock:
            end = f"loaded {self.name} in {self.clock() - self._t0:.1f} s\n" if exc_type is None else ""
            self.stream.write("\r\x1b[K" + end)  # an error's own line follows on a clean line
            self.stream.flush()

    def _run(self) -> None:
        while not self._stop.wait(self.tick):
            self._draw()

    def _draw(self) -> None:
        if not self.on:
            return
        with self._lock:
            if self._stop.is_set() and threading.current_thread() is self._thread:
                return
            self.stream.write(f"\r[loading {self.name}] {self.text} {self.clock() - self._t0:.0f} s\x1b[K")
            self.stream.flush()
