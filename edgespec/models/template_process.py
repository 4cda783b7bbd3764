"""Chat templates rendered in child processes that are killed at the deadline, in lanes so that no
request's render waits behind another request's long one.

models/template.py meters what a template can do before it does it, but its wall-clock deadline is a
flag checked between operations: one long C call (a filter over a long string) runs to its end
first, holding the GIL, so neither the deadline nor SIGTERM is served meanwhile. Here the render runs
in a child process instead, and a render that overruns `template.SECONDS` is ended by killing that
process: nothing a template does can hold the caller past the deadline. The child also runs under a
memory cap (MEMORY_BYTES, on top of what it maps at start), so a template cannot take the device's
memory either.

A small pool of children (POOL_SIZE) serves the renders; a child is reused for every render it gets
(a render costs one pipe round trip, about 0.1-0.3 ms on the dev CPU; starting a child about
0.1-0.3 s) and restarted only after it was killed. Each render is priced before it starts from what
the template was measured to cost per message (the bundle's probe renders a long conversation and a
short one; every render of many messages updates the figure):
 * predicted over REFUSE_FACTOR x the deadline: refused at once, costing nothing (a request of 30,000
   messages through a template that loops per message is a 400 in microseconds, not 2 s of a child);
 * predicted over LONG_RENDER_S (or, before any measurement, LONG_MESSAGES messages or more): a long
   render. Long renders take turns on one child at a time (at most LONG_WAITING wait their turn; more
   are refused), so they are charged to the requests that sent them: the other children stay free
   for everyone else's short renders, which never wait behind a long one.
Where no child can be started (no `fork`/`exec` allowed), renders run in this process under the
metering alone.

Messages are JSON both ways: a request is the template, the message count and the variables; a reply
is ("ok", text, operations, seconds) or (kind, message, 0, seconds) for the exceptions below, which
render() raises again here.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .template import OPS_PER_MESSAGE, SECONDS, TemplateRefused, compiled, render_metered

log = logging.getLogger("edgespec")
MEMORY_BYTES = 1 << 30  # the child's address space beyond what it maps at start: a 2 Mi-character value and its copies, with room to spare
KILL_MARGIN_S = 0.5  # past the deadline the child's own flag check gets to say which budget ran out first
_HEADER = struct.Struct(">I")  # each message: its length, then JSON

POOL_SIZE = 3  # render children at most (each about 20 MB): one long render at a time, the others for short ones
LONG_RENDER_S = 0.1  # a render predicted to take longer is a long one (a real template: about 10,000 messages)
LONG_MESSAGES = 512  # before the template's cost is measured, a conversation this long counts as long
LONG_WAITING = 4  # long renders that may wait for their turn; more are refused (each holds a server thread)
REFUSE_FACTOR = 2.0  # a render predicted over this many deadlines is refused before it starts
MEASURED_MESSAGES = 32  # renders of this many messages or more update the template's cost per message
# what verify accepts per message, in the budget's operations (machine-independent): real templates spend
# 5-40 (Qwen2.5's 11, SmolLM2's 8); one that loops 450 times per message spends 913
MAX_OPS_PER_MESSAGE = 200


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


def _render_here(template: str, n_messages: int, variables: dict) -> tuple[str, str, int, float]:
    """One render, every outcome as (kind, text, operations spent, seconds): what the child sends back."""
    t0 = time.perf_counter()
    ops = 0
    try:
        tmpl = compiled(template, _raise)
        t0 = time.perf_counter()  # the render's own time: compiling is once per template, not per message
        text, ops = render_metered(tmpl, n_messages, **variables)
        kind = "ok"
    except TemplateRefused as e:
        kind, text = "refused", str(e)
    except TemplateRaised as e:
        kind, text = "raised", str(e)
    except RecursionError:
        kind, text = "recursion", ""
    except MemoryError:
        kind, text = "memory", ""
    except Exception as e:  # noqa: BLE001 - TemplateError, TypeError, ZeroDivisionError, ... in the template
        kind, text = "failed", f"{type(e).__name__}\n{str(e)[:1000]}"
    return kind, text, ops, time.perf_counter() - t0


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
    """One render process; one render at a time (the pool hands a child to one render)."""

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

    def render(self, template: str, n_messages: int, variables: dict, seconds: float) -> tuple[str, str, int, float]:
        """(kind, text, operations, seconds) as _render_here says them, from the child."""
        with self.lock:
            proc = self._start()
            if proc is None:
                return _render_here(template, n_messages, variables)
            t0 = time.monotonic()
            deadline = t0 + seconds + KILL_MARGIN_S
            try:
                _write(proc.stdin.fileno(), [template, n_messages, variables])
                reply = _read(proc.stdout.fileno(), deadline)
            except TimeoutError:
                self.kill()
                return "refused", f"rendering took over {seconds:g} s (stopped)", 0, time.monotonic() - t0
            except OSError:  # the child died before or while reading the request
                reply = None
            if reply is None:
                self.kill()
                code = proc.returncode
                if not self.answered:  # it never answered: it cannot start here (an import, a sandbox)
                    self._give_up(f"it exited with {code} before its first answer")
                    return _render_here(template, n_messages, variables)
                return "refused", f"the render's process ended (exit {code}: out of memory?)", 0, time.monotonic() - t0
            self.answered = True
            kind, text, ops, took = reply
            return kind, text, ops, took


class _Pool:
    """Up to `size` children, started as renders need them; long renders take turns on one of them
    (see the module docstring)."""

    def __init__(self, argv: list[str] | None = None, size: int = POOL_SIZE) -> None:
        self.argv, self.size = argv, size
        self.cond = threading.Condition()
        self.children: list[_Child] = []  # every child made (idle or rendering)
        self.idle: list[_Child] = []
        self.long_turn = threading.Lock()  # held by the long render in progress
        self.long_waiting = 0
        self.unavailable: str | None = None  # set once a child could not start: renders run here after that

    @property
    def starts(self) -> int:
        return sum(c.starts for c in self.children)

    def render(self, template: str, n_messages: int, variables: dict, seconds: float,
               long: bool = False) -> tuple[str, str, int, float]:
        if self.unavailable:
            return _render_here(template, n_messages, variables)
        if not long:
            return self._on_a_child(template, n_messages, variables, seconds)
        with self.cond:
            if self.long_waiting >= LONG_WAITING:
                return ("refused", f"{self.long_waiting} long conversations are already waiting for their render; "
                        "retry shortly, or send fewer messages", 0, 0.0)
            self.long_waiting += 1
        self.long_turn.acquire()
        with self.cond:
            self.long_waiting -= 1
        try:
            return self._on_a_child(template, n_messages, variables, seconds)
        finally:
            self.long_turn.release()

    def _on_a_child(self, template: str, n_messages: int, variables: dict, seconds: float):
        child = self._take()
        try:
            out = child.render(template, n_messages, variables, seconds)
            if child.unavailable:
                self.unavailable = child.unavailable
            return out
        finally:
            with self.cond:
                self.idle.append(child)
                self.cond.notify()

    def _take(self) -> _Child:
        """An idle child, a new one while there are fewer than `size`, else the first one freed (a
        short render waits for a child at most the few short renders ahead of it: the long one holds
        one child, never all)."""
        with self.cond:
            while not self.idle and len(self.children) >= self.size:
                self.cond.wait()
            if self.idle:
                child = self.idle.pop()
            else:
                child = _Child(self.argv)
                self.children.append(child)
            if not self.idle and len(self.children) < self.size and not self.unavailable:
                # a spare, started now (a start takes a few tenths of a second, its imports running while
                # this render does), so the next render finds a child ready even if this one is long
                spare = _Child(self.argv)
                spare._start()
                self.children.append(spare)
                self.idle.append(spare)
            return child

    def kill(self) -> None:
        with self.cond:
            for c in self.children:
                c.kill()


class _Costs:
    """Seconds per message of each template lately rendered: the probe's measurement, then every render
    of MEASURED_MESSAGES or more (a slower one is believed at once, a faster one a quarter at a time, so
    a template cannot talk its price down with a few cheap renders). Renders are priced with it."""

    KEEP = 8  # templates remembered (a server has one)

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.per_message: dict[str, float] = {}

    def predict(self, template: str, n_messages: int) -> float | None:
        with self.lock:
            per = self.per_message.get(template)
        return None if per is None else per * n_messages

    def observe(self, template: str, n_messages: int, seconds: float) -> None:
        if n_messages < MEASURED_MESSAGES:
            return
        seen = seconds / n_messages
        with self.lock:
            old = self.per_message.pop(template, None)
            self.per_message[template] = seen if old is None or seen > old else 0.75 * old + 0.25 * seen
            while len(self.per_message) > self.KEEP:
                del self.per_message[next(iter(self.per_message))]


_pool = _Pool()
_costs = _Costs()


def templates_priced() -> int:
    """Templates whose render price is remembered now, at most _Costs.KEEP (/metrics' memory gauges)."""
    with _costs.lock:
        return len(_costs.per_message)


def render(template: str, n_messages: int, **variables: Any) -> str:
    """The rendered text, in a child process under template.py's budgets and a deadline that kills
    it, priced first (see the module docstring). Raises TemplateRefused (a budget, the deadline, the
    price), TemplateRaised (the template's own raise_exception), RecursionError, MemoryError or
    TemplateFailed (any other error of the template)."""
    return _rendered(_render_priced(template, n_messages, variables))[0]


def _render_priced(template: str, n_messages: int, variables: dict) -> tuple[str, str, int, float]:
    try:
        json.dumps(variables)
    except (TypeError, ValueError):  # not JSON (a caller's own object): rendered here, metered only
        return _render_here(template, n_messages, variables)
    predicted = _costs.predict(template, n_messages)
    if predicted is not None and predicted > REFUSE_FACTOR * SECONDS:
        per = predicted / max(n_messages, 1)
        return ("refused", f"{n_messages:,} messages would take about {predicted:.0f} s to render "
                f"({per * 1e6:,.0f} ms per 1,000 messages; limit {SECONDS:g} s)", 0, 0.0)
    long = predicted >= LONG_RENDER_S if predicted is not None else n_messages >= LONG_MESSAGES
    out = _pool.render(template, n_messages, variables, SECONDS, long=long)
    kind, _, _, took = out
    if kind == "ok" or "rendering took over" in out[1]:  # a finished render, or a lower bound on its cost
        _costs.observe(template, n_messages, took)
    return out


def _rendered(out: tuple[str, str, int, float]) -> tuple[str, int]:
    """(text, operations) of an "ok" reply; the exception it stands for otherwise."""
    kind, text, ops, _ = out
    if kind == "ok":
        return text, ops
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


# every chat model's template renders these (no system turn: some templates refuse one); the second
# differs in the user's text, which each prompt must hold
PROBE = ({"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi."},
         {"role": "user", "content": "Thanks"})
PROBE_OTHER = ({"role": "user", "content": "Good day"}, {"role": "assistant", "content": "Hello."},
               {"role": "user", "content": "Which bus?"})
LONG_PROBE = 128  # messages in the long conversation that prices a message


@dataclass(frozen=True)
class Examined:
    """What probing a template found: the problem that refuses a bundle, one line (None: it renders a
    short conversation, holding the user's text); the cost of a message, in operations and (on this
    machine) seconds, from a long conversation and a short one, and `cost` when that is out of bounds."""

    problem: str | None
    ops_per_message: float | None = None
    seconds_per_message: float | None = None
    cost: str | None = None


def examine(template: Any, *, bos_token: str = "", eos_token: str = "") -> Examined:
    """Compiles the template and renders PROBE and PROBE_OTHER under the budgets, then a LONG_PROBE
    conversation to price a message (which also seeds the price renders are charged)."""
    if not isinstance(template, str):
        return Examined(f"is a {type(template).__name__}, not a string")
    kw = dict(add_generation_prompt=True, bos_token=bos_token, eos_token=eos_token)
    short = _probe_render(template, PROBE, kw)
    if isinstance(short, str):
        return Examined(short)
    other = _probe_render(template, PROBE_OTHER, kw)
    if isinstance(other, str):
        return Examined(other)
    last = len(PROBE) - 1
    for conv, (text, _, _) in ((PROBE, short), (PROBE_OTHER, other)):
        said = conv[last]["content"]
        if said not in text:
            return Examined(f"ignores the conversation: its prompt for a short chat does not hold the user's text "
                            f"(messages[{last}].content {said!r})")
    if short[0] == other[0]:
        return Examined(f"ignores the conversation: two chats that differ in messages[{last}].content render "
                        "the same prompt")
    turns = [{"role": ("user", "assistant")[i % 2], "content": f"Turn {i}."} for i in range(LONG_PROBE - 1)]
    long = _probe_render(template, [*turns, {"role": "user", "content": "Thanks"}], kw)
    if isinstance(long, str):  # the short one rendered: the long one ran out of budget, or refused its length
        if "budget" not in long and "took over" not in long:
            return Examined(None)  # (a template may refuse long chats: not a cost)
        return Examined(None, cost=f"costs over {OPS_PER_MESSAGE:,} operations per message of a long chat "
                                   f"(limit {MAX_OPS_PER_MESSAGE}): {long}")
    n = LONG_PROBE - len(PROBE)
    ops = (long[1] - short[1]) / n
    seconds = max(long[2] - min(short[2], other[2]), 0.0) / n  # (the first render of a child warms it up)
    cost = None
    if ops > MAX_OPS_PER_MESSAGE:
        cost = (f"costs {ops:,.0f} operations per message (limit {MAX_OPS_PER_MESSAGE}; {seconds * 1e6:,.0f} ms "
                f"per 1,000 messages here): a long conversation would hold its render for seconds")
    return Examined(None, ops, seconds, cost)


def _probe_render(template: str, messages, kw: dict) -> tuple[str, int, float] | str:
    """(text, operations, seconds) of one probe conversation, or what is wrong, one line."""
    out = _render_priced(template, len(messages), dict(messages=[dict(m) for m in messages], **kw))
    try:
        text, ops = _rendered(out)
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
    return text, ops, out[3]


def probe(template: Any, *, bos_token: str = "", eos_token: str = "") -> str | None:
    """None when the template renders a short conversation holding the user's text, else what is
    wrong, one line (models/bundle.py refuses the bundle with it)."""
    return examine(template, bos_token=bos_token, eos_token=eos_token).problem
