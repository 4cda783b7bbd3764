"""Power and thermal governor: keeps a board inside its power budget and temperature limit by doing
less work per token, never by failing a request.

The speculative loop asks `limits()` before every round and reports `on_tokens(n)` after it. Over the
power budget (rolling average), over the temperature limit, or with the firmware's throttled bit set,
the governor climbs one rung of this ladder per `hold_s`; comfortably under both it climbs down one
rung per `relax_s` (slower, so it does not oscillate around the limit):

    0 normal       everything the request asked for
    1 small-k      at most `small_k` drafted tokens per round (less wasted verify work)
    2 ngram-only   no draft model passes at all; prompt lookup costs almost nothing
    3 fewer-cores  the process may use half its cores (see AffinityLimiter: onnxruntime cannot change
                   a session's thread count, but the kernel can keep its threads on fewer cores).
                   Only with sessions created without spinning (`limit_cores=True`): pool threads that
                   busy-wait for a sibling descheduled on the same core make each token cost more CPU
                   (measured: 1.65x the CPU time per token, 0.3x the speed), so otherwise this rung is
                   skipped. The thread pool target and draft share always spins (onnxruntime's
                   Python API cannot stop its global pool spinning), so an engine with a draft model
                   goes from n-gram-only straight to pacing; `state()["cores_rung"]` says which
    4 paced        sleep `pace_s` after each round; grows x1.6 per step while still over, shrinks
                   x1.6 per step once under, and the rung is left when it falls below `min_pace_s`

Sensor reads are cached (`Sensors.min_interval_s`), so `limits()` is a clock read and a comparison
on most calls. Energy is the trapezoid integral of board power between samples; J/token is that
energy over the tokens reported in the same window.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Protocol

from ..units import parse_celsius, parse_watts
from . import devices, sensors
from .affinity import AffinityLimiter

log = logging.getLogger("edgespec.edge.governor")

LEVELS = ("normal", "small-k", "ngram-only", "fewer-cores", "paced")
NORMAL, SMALL_K, NGRAM, FEWER_CORES, PACED = range(len(LEVELS))


class SensorSource(Protocol):
    """What the governor reads (sensors.Sensors is the real one; tests inject their own)."""

    has_power: bool
    has_temp: bool
    min_interval_s: float  # reads closer together than this return the cached reading

    def read(self) -> sensors.Reading: ...


class CpuLimiter(Protocol):
    """Holds the process to fewer cores (affinity.AffinityLimiter is the real one)."""

    original: list[int]  # the cores the process started with

    @property
    def available(self) -> bool: ...

    def limit(self, n: int) -> int: ...

    def restore(self) -> None: ...


@dataclass
class Limits:
    """What the next speculative round may do. `max_k=None`: no cap; `drafting`: "any" | "ngram" |
    "none"; `pace_s`: seconds to sleep after the round; `cores`: cores the process is held to (None:
    all of them; informational, the governor applies it itself)."""

    max_k: int | None = None
    drafting: str = "any"
    pace_s: float = 0.0
    cores: int | None = None
    level: int = NORMAL

    @property
    def level_name(self) -> str:
        return LEVELS[self.level]


class Governor:
    """See the module docstring. Thread-safe: the server may call `limits()` and `state()` from
    different threads."""

    def __init__(
        self,
        sensors: SensorSource | None,
        *,
        power_budget_w: float | None = None,
        max_temp_c: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        cpu_limiter: CpuLimiter | None = None,
        limit_cores: bool = True,
        react_to_throttle: bool = True,
        small_k: int = 2,
        window_s: float = 5.0,
        hold_s: float = 2.0,
        relax_s: float = 8.0,
        hysteresis: float = 0.9,
        temp_margin_c: float = 5.0,
        stale_s: float = 30.0,
        sample_interval_s: float | None = None,
        min_pace_s: float = 0.01,
        max_pace_s: float = 2.0,
    ):
        if power_budget_w is not None and not (power_budget_w > 0 and math.isfinite(power_budget_w)):
            raise ValueError(f"power budget must be a positive number of watts, got {power_budget_w!r}")
        if max_temp_c is not None and not (0 < max_temp_c < 150):
            raise ValueError(f"max temperature must be between 0 and 150 C, got {max_temp_c!r}")
        self.sensors = sensors
        self.power_budget_w = power_budget_w
        self.max_temp_c = max_temp_c
        self.clock = clock
        self.cpu_limiter = cpu_limiter if cpu_limiter is not None else AffinityLimiter()
        self.limit_cores = limit_cores
        self.react_to_throttle = react_to_throttle
        self.small_k = small_k
        self.window_s = window_s
        self.hold_s = hold_s
        self.relax_s = relax_s
        self.hysteresis = hysteresis
        self.temp_margin_c = temp_margin_c
        self.stale_s = stale_s
        interval = getattr(sensors, "min_interval_s", 0.2) if sensors is not None else 0.2
        self.sample_interval_s = sample_interval_s if sample_interval_s is not None else interval
        self.min_pace_s = min_pace_s
        self.max_pace_s = max_pace_s
        self._lock = threading.Lock()
        self.level = NORMAL
        self.pace_s = 0.0
        self.cores: int | None = None
        self.reasons: list[str] = []
        self.changes = 0  # rung changes so far (for /metrics)
        self._last_change = -math.inf
        self._over_since: float | None = None  # start of the current stretch over a limit
        self._last_sample = -math.inf
        # sensor state
        self.power_now_w: float | None = None
        self.power_w: float | None = None  # rolling (exponential, time-weighted) average
        self.temp_c: float | None = None
        self.throttled: bool | None = None
        self.throttle_bits: int | None = None
        self._power_t: float | None = None  # time of the last valid power reading
        self._temp_t = -math.inf
        self._throttle_t = -math.inf
        self.energy_j = 0.0
        self.tokens = 0
        self._history: deque[tuple[float, float, int]] = deque()  # (t, energy_j, tokens) per sample
        self.sensor_errors: list[str] = []
        self._logged_errors: set[str] = set()
        self.unenforced: list[str] = []
        self.power_scope: str | None = None
        has_power = bool(getattr(sensors, "has_power", False))
        has_temp = bool(getattr(sensors, "has_temp", False))
        if power_budget_w is not None and not has_power:
            self.unenforced.append(f"power budget {power_budget_w:g} W: no power sensor on this board")
        if max_temp_c is not None and not has_temp:
            self.unenforced.append(f"temperature limit {max_temp_c:g} C: no thermal zone on this board")
        for line in self.unenforced:
            log.warning("%s; it is not enforced", line)
        if (power_budget_w is not None or max_temp_c is not None) and self.cores_rung != "available":
            log.info("governor: the fewer-cores rung is skipped (%s); over a limit it goes from n-gram-only "
                     "straight to pacing", self.cores_rung.removeprefix("skipped: "))

    @property
    def cores_rung(self) -> str:
        """Whether the fewer-cores rung can be used, and if not why (for state() and the log)."""
        if not self.limit_cores:
            return "skipped: the sessions' thread pool spins (onnxruntime's shared pool cannot stop spinning)"
        if self.cpu_limiter is None or not self.cpu_limiter.available:
            return "skipped: fewer than 2 cores, or no CPU affinity on this OS"
        return "available"

    # -- the two calls of the speculative loop ---------------------------------------------------
    def limits(self) -> Limits:
        now = self.clock()
        with self._lock:
            if now - self._last_sample >= self.sample_interval_s:
                self._sample(now)
                self._decide(now)
            return self._limits()

    def on_tokens(self, n: int) -> None:
        if n <= 0:
            return
        with self._lock:
            self.tokens += int(n)

    # -- energy -----------------------------------------------------------------------------------
    @property
    def energy_j_per_token(self) -> float | None:
        """Board energy per token over the last `2 x window_s` seconds of samples (None without a
        power sensor or without tokens in that window)."""
        with self._lock:
            if len(self._history) < 2:
                return None
            t0, e0, n0 = self._history[0]
            t1, e1, n1 = self._history[-1]
            if n1 <= n0 or e1 <= e0:
                return None
            return (e1 - e0) / (n1 - n0)

    def mark(self) -> tuple[float, int]:
        """A point to measure one request's energy from (see `j_per_token_since`)."""
        with self._lock:
            return (self.energy_j, self.tokens)

    def j_per_token_since(self, mark: tuple[float, int]) -> float | None:
        with self._lock:
            if self._power_t is None:
                return None
            now = self.clock()
            self._sample(now)
            de, dn = self.energy_j - mark[0], self.tokens - mark[1]
            return de / dn if dn > 0 and de > 0 else None

    # -- internals --------------------------------------------------------------------------------
    def _limits(self) -> Limits:
        lv = self.level
        return Limits(
            max_k=self.small_k if lv >= SMALL_K else None,
            drafting="ngram" if lv >= NGRAM else "any",
            pace_s=self.pace_s if lv >= PACED else 0.0,
            cores=self.cores,
            level=lv,
        )

    def _note_error(self, msg: str) -> None:
        if msg not in self._logged_errors:
            self._logged_errors.add(msg)
            log.warning("sensor: %s (carrying on with the last good value)", msg)

    def _sample(self, now: float) -> None:
        self._last_sample = now
        if self.sensors is None:
            return
        try:
            r = self.sensors.read()
        except Exception as e:  # a sensor object must not take a request down with it
            self.sensor_errors = [f"sensors: {e}"]
            self._note_error(self.sensor_errors[0])
            return
        self.sensor_errors = list(r.errors)
        for e in r.errors:
            self._note_error(e)
        if r.power_w is not None:
            p = float(r.power_w)
            if self._power_t is not None and self.power_now_w is not None:
                dt = now - self._power_t
                # gaps (idle, no requests) are not integrated: J/token is about generating
                if 0 < dt <= max(3 * self.sample_interval_s, 2.0):
                    self.energy_j += 0.5 * (p + self.power_now_w) * dt
                if dt > 0 and self.power_w is not None:
                    a = 1.0 - math.exp(-dt / self.window_s)
                    self.power_w += a * (p - self.power_w)
            if self.power_w is None:
                self.power_w = p
            self.power_now_w = p
            self.power_scope = getattr(r, "power_scope", None)
            self._power_t = now
        if r.temp_c is not None:
            self.temp_c = float(r.temp_c)
            self._temp_t = now
        if r.throttled is not None:
            self.throttled = bool(r.throttled)
            self.throttle_bits = r.throttle_bits
            self._throttle_t = now
        self._history.append((now, self.energy_j, self.tokens))
        while len(self._history) > 2 and now - self._history[0][0] > 2 * self.window_s:
            self._history.popleft()

    def _fresh(self, t: float | None, now: float) -> bool:
        return t is not None and now - t <= self.stale_s

    def _decide(self, now: float) -> None:
        over: list[str] = []
        under = True
        if self.power_budget_w is not None and self._fresh(self._power_t, now) and self.power_w is not None:
            if self.power_w > self.power_budget_w:
                scope = f" ({self.power_scope})" if self.power_scope and self.power_scope != "board input" else ""
                over.append(f"power{scope} {self.power_w:.1f} W over budget {self.power_budget_w:g} W")
            if self.power_w > self.power_budget_w * self.hysteresis:
                under = False
        if self.max_temp_c is not None and self._fresh(self._temp_t, now) and self.temp_c is not None:
            if self.temp_c > self.max_temp_c:
                over.append(f"temperature {self.temp_c:.1f} C over limit {self.max_temp_c:g} C")
            if self.temp_c > self.max_temp_c - self.temp_margin_c:
                under = False
        if self.react_to_throttle and self._fresh(self._throttle_t, now) and self.throttled:
            from .sensors import throttle_reasons

            why = ", ".join(throttle_reasons(self.throttle_bits)) or "throttled"
            over.append(f"firmware reports {why}")
            under = False
        if over:
            self.reasons = over
            if self._over_since is None:
                self._over_since = now
            # one rung per hold_s, and only once the excess has lasted hold_s (one hot sample is noise)
            if now - max(self._last_change, self._over_since) >= self.hold_s:
                self._escalate(now)
            return
        self._over_since = None
        if self.level == NORMAL:
            self.reasons = []
        elif under and now - self._last_change >= self.relax_s:
            self.reasons = []
            self._relax(now)

    def _escalate(self, now: float) -> None:
        before = (self.level, self.pace_s)
        if self.level < PACED:
            nxt = self.level + 1
            if nxt == FEWER_CORES:
                if self.limit_cores and self.cpu_limiter is not None and self.cpu_limiter.available:
                    half = max(1, len(self.cpu_limiter.original) // 2)
                    self.cores = self.cpu_limiter.limit(half)
                else:
                    nxt = PACED  # one core only, or no affinity on this OS: go straight to pacing
            if nxt == PACED:
                self.pace_s = self.min_pace_s * 2
            self.level = nxt
        else:
            self.pace_s = min(self.max_pace_s, max(self.min_pace_s, self.pace_s * 1.6))
        if (self.level, self.pace_s) != before:
            self._last_change = now
            self.changes += 1
            log.info("governor: %s -> %s%s (%s)", LEVELS[before[0]], LEVELS[self.level],
                     f", pace {self.pace_s * 1000:.0f} ms" if self.level == PACED else "", "; ".join(self.reasons))

    def _relax(self, now: float) -> None:
        before = self.level
        if self.level == PACED and self.pace_s / 1.6 >= self.min_pace_s:
            self.pace_s /= 1.6
        elif self.level == PACED:
            self.pace_s = 0.0
            self.level = FEWER_CORES if self.cores is not None else NGRAM
        elif self.level == FEWER_CORES:
            if self.cpu_limiter is not None:
                self.cpu_limiter.restore()
            self.cores = None
            self.level = NGRAM
        else:
            self.level -= 1
        self._last_change = now
        self.changes += 1
        log.info("governor: %s -> %s (under budget)", LEVELS[before], LEVELS[self.level])

    # -- reporting --------------------------------------------------------------------------------
    def state(self) -> dict:
        """For /metrics, `doctor` and stats: numbers and the reasons for the current rung."""
        jpt = self.energy_j_per_token
        with self._lock:
            return {
                "level": self.level,
                "level_name": LEVELS[self.level],
                "reasons": list(self.reasons),
                "power_w": None if self.power_w is None else round(self.power_w, 3),
                "power_now_w": None if self.power_now_w is None else round(self.power_now_w, 3),
                "power_budget_w": self.power_budget_w,
                "power_scope": self.power_scope,  # what the watts cover: board input / core rails (sensors.py)
                "temp_c": None if self.temp_c is None else round(self.temp_c, 2),
                "max_temp_c": self.max_temp_c,
                "throttled": self.throttled,
                "energy_j": round(self.energy_j, 3),
                "tokens": self.tokens,
                "energy_j_per_token": None if jpt is None else round(jpt, 4),
                "pace_s": round(self.pace_s, 4) if self.level >= PACED else 0.0,
                "cores": self.cores,
                "changes": self.changes,
                "unenforced": list(self.unenforced),
                "cores_rung": self.cores_rung,
                "sensor_errors": list(self.sensor_errors),
            }

    def close(self) -> None:
        """Gives the process its cores back."""
        with self._lock:
            if self.cores is not None and self.cpu_limiter is not None:
                self.cpu_limiter.restore()
                self.cores = None


def from_options(*, device=None, power_budget=None, max_temp=None, root: str = "/", clock=time.monotonic,
                 spinning: bool | None = None) -> Governor:
    """What Engine.open calls: finds the sensors (device profile rules), parses the budget options
    ("10W", 10, "80C", 80) and returns a governor (one that only measures when both are None).

    `spinning`: how the engine created its onnxruntime sessions (providers.session_options). The
    fewer-cores rung is used only when they do not spin (spinning=False). Engine.open passes what
    its sessions really do: the shared thread pool of a target + draft engine always spins (its
    spinning cannot be turned off from Python), so there the rung is skipped and state() says so.
    `device`: a name, "auto"/None (detect the board under `root`) or a DeviceProfile."""
    profile = devices.resolve(device, root=root)
    found = sensors.discover(root, profile=profile, clock=clock)
    pb = parse_watts(power_budget) if power_budget is not None else None
    mt = parse_celsius(max_temp) if max_temp is not None else None
    if mt is None and getattr(profile, "max_temp_c", None):
        mt = float(profile.max_temp_c)
    return Governor(found, power_budget_w=pb, max_temp_c=mt, clock=clock, limit_cores=spinning is False)
