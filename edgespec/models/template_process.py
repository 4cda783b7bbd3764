"""Chat templates rendered in a child process that is killed at the deadline.

models/template.py meters what a template can do before it does it, but its wall-clock deadline is a
flag checked between operations: one long C call (a filter over a long string) runs to its end
first, holding the GIL, so neither the deadline nor SIGTERM is served meanwhile. Here the render runs
in a child process instead, and a render that overruns `template.SECONDS` is ended by killing that
process: nothing a template does can hold the caller past the deadline. The child also runs under a
memory cap (MEMORY_BYTES), so a template cannot take the device's memory either.

The child is started once and reused for every render (a render costs one pipe round trip, about
0.1-0.3 ms on the dev CPU; starting a child costs about 0.1-0.3 s): it is restarted only after it was
killed. Renders from several threads take turns (one child; a render takes milliseconds). Where no
child can be started (no `fork`/`exec` allowed), renders run in this process under the metering alone.

Messages are JSON both ways: a request is the template, the message count and the variables; a reply
is ("ok", text) or (kind, message) for the exceptions below, which render() raises again here.
"""
from __future__ import annotations

import json
import logging
import os
import select
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from .template import SECONDS, TemplateRefused, compiled, render_budgeted

log = logging.getLogger("edgespec")
MEMORY_BYTES = 1 << 30  # the child's address space beyond what it maps at start: a 2 Mi-character value and its copies, with room to spare
KILL_MARGIN_S = 0.5  # past the deadline the child's own flag check gets to say which budget ran out first
_HEADER = struct.Struct(">I")  # each message: its length, then JSON


class TemplateRaised(Exception):
    """The template's own raise_exception(message): it refuses this conversation."""


class TemplateFailed(Exception):
    """The template raised some other error on these variables: its type's name and its message."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(name, message)
        self.name, self.message = name, message

    def __str__(self) -> str:
        return self.message

    def one_line(self) -> str:
        first = (self.message.strip().splitlines() or [""])[0]
        return f"{self.name}: {first[:200]}" if first else self.name


# --- the child ---------------------------------------------------------------------------------------
def _raise(message: str):
    raise TemplateRaised(str(message))


def _render_here(template: str, n_messages: int, variables: dict) -> tuple[str, str]:
    """One render, every outcome as (kind, text): what the child sends back."""
    try:
        return "ok", render_budgeted(compiled(template, _raise), n_messages, **variables)
    except TemplateRefused as e:
        return "refused", str(e)
    except TemplateRaised as e:
        return "raised", str(e)
    except RecursionError:
        return "recursion", ""
    except MemoryError:
        return "memory", ""
    except Exception as e:  # noqa: BLE001 - TemplateError, TypeError, ZeroDivisionError, ... in the template
        return "failed", f"{type(e).__name__}\n{str(e)[:1000]}"


def main() -> None:
    """The child: renders each request from stdin, replies on stdout, until stdin closes."""
    import resource

    try:
        # the budget on top of what this process already maps: a site hook that loaded CUDA's libraries
        # (gpu-check's venv preloads them in every python it starts) maps gigabytes of address space before
        # main() runs, and an absolute limit then refused every template (seen on an H200 run)
        limit = _address_space_bytes() + MEMORY_BYTES
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (OSError, ValueError):  # a sandbox that forbids it (or a lower hard limit): the budgets still hold
        pass
    rfd, wfd = sys.stdin.fileno(), sys.stdout.fileno()
    while True:
        req = _read(rfd, None)
        if req is None:
            return
        reply = _render_here(*req)
        _write(wfd, reply)


def _address_space_bytes() -> int:
    """This process's mapped address space (VmSize), 0 where /proc cannot tell."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


# --- the parent --------------------------------------------------------------------------------------
def _write(fd: int, obj: Any) -> None:
    data = json.dumps(obj, ensure_ascii=True).encode("ascii")
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _read(fd: int, deadline: float | None) -> Any:
    """One message, or None at end of file; TimeoutError past `deadline` (time.monotonic)."""
    head = _read_exact(fd, _HEADER.size, deadline)
    if head is None:
        return None
    body = _read_exact(fd, _HEADER.unpack(head)[0], deadline)
    return None if body is None else json.loads(body)


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes | None:
    out = bytearray()
    while len(out) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
        chunk = os.read(fd, min(n - len(out), 1 << 20))
        if not chunk:
            return None
        out += chunk
    return bytes(out)


CHILD_ARGV = [sys.executable, "-c", "from edgespec.models.template_process import main; main()"]


class _Child:
    def __init__(self, argv: list[str] | None = None) -> None:
        self.argv = argv or CHILD_ARGV  # (tests start a child that never answers, to see it killed)
        self.lock = threading.Lock()
        self.proc: subprocess.Popen | None = None
        self.starts = 0  # children started (tests read it: a kill means a restart)
        self.unavailable: str | None = None  # why no child can be started (renders then run here)
        self.answered = False  # the current child has answered once (a child that cannot start never does)

    def _start(self) -> subprocess.Popen | None:
        if self.proc is not None and self.proc.poll() is None:
            return self.proc
        if self.unavailable:
            return None
        root = str(Path(__file__).resolve().parents[2])  # the folder holding the edgespec package
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p),
               "EDGESPEC_NO_PRELOAD": "1"}  # the child renders text: no CUDA libraries loaded by a site hook
        try:
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                start_new_session=True)  # a terminal's Ctrl-C is the parent's to handle
        except OSError as e:
            self._give_up(f"{type(e).__name__}: {e}")
            return None
        self.starts += 1
        self.answered = False
        return self.proc

    def _give_up(self, why: str) -> None:
        self.unavailable = why
        log.warning("chat templates render in this process, under the budgets but without a deadline that can "
                    "stop one call: the template process cannot run (%s)", why)

    def kill(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            proc.kill()
            proc.wait()
            for f in (proc.stdin, proc.stdout):
                f.close()

    def render(self, template: str, n_messages: int, variables: dict, seconds: float) -> tuple[str, str]:
        with self.lock:
            proc = self._start()
            if proc is None:
                return _render_here(template, n_messages, variables)
            deadline = time.monotonic() + seconds + KILL_MARGIN_S
            try:
                _write(proc.stdin.fileno(), [template, n_messages, variables])
                reply = _read(proc.stdout.fileno(), deadline)
            except TimeoutError:
                self.kill()
                return "refused", f"rendering took over {seconds:g} s (stopped)"
            except OSError:  # the child died before or while reading the request
                reply = None
            if reply is None:
                self.kill()
                code = proc.returncode
                if not self.answered:  # it never answered: it cannot start here (an import, a sandbox)
                    self._give_up(f"it exited with {code} before its first answer")
                    return _render_here(template, n_messages, variables)
                return "refused", f"the render's process ended (exit {code}: out of memory?)"
            self.answered = True
            return tuple(reply)


_child = _Child()


def render(template: str, n_messages: int, **variables: Any) -> str:
    """The rendered text, in the child process under template.py's budgets and a deadline that kills
    it. Raises TemplateRefused (a budget, the deadline), TemplateRaised (the template's own
    raise_exception), RecursionError, MemoryError or TemplateFailed (any other error of the template)."""
    try:
        json.dumps(variables)
    except (TypeError, ValueError):  # not JSON (a caller's own object): rendered here, metered only
        return render_budgeted(compiled(template, _raise), n_messages, **variables)
    kind, text = _child.render(template, n_messages, variables, SECONDS)
    if kind == "ok":
        return text
    if kind == "refused":
        raise TemplateRefused(text)
    if kind == "raised":
        raise TemplateRaised(text)
    if kind == "recursion":
        raise RecursionError("the template recursed too deeply")
    if kind == "memory":
        raise MemoryError
    name, _, message = text.partition("\n")
    raise TemplateFailed(name, message)


# every chat model's template renders this (no system turn: some templates refuse one)
PROBE = ({"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi."},
         {"role": "user", "content": "Thanks"})


def probe(template: Any, *, bos_token: str = "", eos_token: str = "") -> str | None:
    """Compiles the template and renders PROBE under the budgets: None when it renders, else what
    is wrong, one line (models/bundle.py refuses the bundle with it)."""
    if not isinstance(template, str):
        return f"is a {type(template).__name__}, not a string"
    try:
        render(template, len(PROBE), messages=[dict(m) for m in PROBE], add_generation_prompt=True,
               bos_token=bos_token, eos_token=eos_token)
    except TemplateRefused as e:
        return str(e)
    except RecursionError:
        return "recurses without end (a macro or loop that calls itself)"
    except TemplateRaised as e:
        return f"refuses a plain user/assistant/user conversation: {str(e)[:200]}"
    except MemoryError:
        return "ran out of memory rendering a short conversation"
    except TemplateFailed as e:
        return f"fails on a short conversation: {e.one_line()}"
    return None
