"""A dependency-free progress line for long byte-counting steps (pull runs on boards without tqdm)."""
from __future__ import annotations

import sys
import time
from typing import Callable


def status(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Progress:
    """A one-line progress bar on stderr for long byte-counting steps (redrawn in place on a
    terminal; a line every 25 % otherwise, so logs stay short). No dependency: `pull` runs on boards
    where the export extra (and tqdm) is not installed."""

    def __init__(self, label: str, total: int, *, start: int = 0, stream=None, clock: Callable[[], float] = time.monotonic):
        self.label = label
        self.total = max(int(total), 1)
        self.done = int(start)
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.clock = clock
        self.t0 = clock()
        self.start = int(start)
        self._last_draw = 0.0
        self._last_quarter = -1
        self.closed = False
        self._draw()

    def advance(self, n: int) -> None:
        self.done += n
        now = self.clock()
        if self.tty and now - self._last_draw < 0.2:
            return
        self._draw()

    def text(self) -> str:
        frac = min(self.done / self.total, 1.0)
        width = 24
        filled = int(frac * width)
        el = max(self.clock() - self.t0, 1e-9)
        rate = (self.done - self.start) / el
        mb = 1 << 20
        eta = f" eta {int((self.total - self.done) / rate)}s" if rate > 0 and self.done < self.total else ""
        return (f"{self.label} [{'#' * filled}{'.' * (width - filled)}] {frac * 100:3.0f}% "
                f"{self.done / mb:.0f}/{self.total / mb:.0f} MB {rate / mb:.1f} MB/s{eta}")

    def _draw(self) -> None:
        self._last_draw = self.clock()
        if self.tty:
            self.stream.write("\r" + self.text() + "\x1b[K")
            self.stream.flush()
            return
        quarter = int(min(self.done / self.total, 1.0) * 4)
        if quarter != self._last_quarter:
            self._last_quarter = quarter
            self.stream.write(self.text() + "\n")
            self.stream.flush()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._draw()
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
