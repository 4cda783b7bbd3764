"""Prometheus text exposition (format 0.0.4), written by hand: a handful of counters, gauges and
histograms do not justify a dependency on a board where every package has to be cross-installed."""
from __future__ import annotations

import math
import threading
from collections import Counter
from typing import Any, Iterable

TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
DURATION_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
QUEUE_BUCKETS = (0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0)


class Histogram:
    def __init__(self, buckets: Iterable[float]):
        self.buckets = tuple(buckets)
        self.counts = [0] * len(self.buckets)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.sum += value
        self.count += 1
        for i, b in enumerate(self.buckets):
            if value <= b:
                self.counts[i] += 1

    def lines(self, name: str) -> list[str]:
        out = [f'{name}_bucket{{le="{_num(b)}"}} {c}' for b, c in zip(self.buckets, self.counts)]
        out.append(f'{name}_bucket{{le="+Inf"}} {self.count}')
        out.append(f"{name}_sum {_num(self.sum)}")
        out.append(f"{name}_count {self.count}")
        return out


def _num(v: float | int) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int):
        return str(v)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


def _label(v: str) -> str:
    return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class Metrics:
    """Updated by request handlers in the event loop and read by /metrics; a lock keeps a scrape
    consistent if a future caller updates from another thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: Counter[tuple[str, int]] = Counter()
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.drafted = 0
        self.accepted = 0
        self.target_passes = 0
        self.generation_seconds = 0.0
        self.last_tokens_per_second: float | None = None
        self.last_acceptance_rate: float | None = None
        self.last_energy_j_per_token: float | None = None
        self.ttft = Histogram(TTFT_BUCKETS)
        self.duration = Histogram(DURATION_BUCKETS)
        self.queue_wait = Histogram(QUEUE_BUCKETS)

    def observe_request(self, endpoint: str, status: int, seconds: float) -> None:
        with self._lock:
            self.requests[(endpoint, int(status))] += 1
            self.duration.observe(seconds)

    def observe_generation(self, stats: Any, *, ttft: float | None, queue_wait: float | None, seconds: float | None) -> None:
        """`stats`: the engine's GenerationStats; `ttft`/`queue_wait`: as the client saw them (the queue included)."""
        g = lambda name, default=0: getattr(stats, name, default)  # noqa: E731
        with self._lock:
            self.prompt_tokens += int(g("prompt_tokens") or 0)
            self.completion_tokens += int(g("new_tokens") or 0)
            self.drafted += int(g("drafted") or 0)
            self.accepted += int(g("accepted") or 0)
            self.target_passes += int(g("target_passes") or 0)
            if seconds is not None:
                self.generation_seconds += seconds
            tps = g("decode_tokens_per_second", None)
            if tps is not None and math.isfinite(tps):
                self.last_tokens_per_second = float(tps)
            rate = g("acceptance_rate", None)
            if g("drafted") and rate is not None and math.isfinite(rate):
                self.last_acceptance_rate = float(rate)
            energy = g("energy_j_per_token", None)
            if energy is not None and math.isfinite(energy):
                self.last_energy_j_per_token = float(energy)
            if ttft is not None:
                self.ttft.observe(ttft)
            if queue_wait is not None:
                self.queue_wait.observe(queue_wait)

    def render(self, gauges: dict[str, tuple[str, float | int]], info: dict[str, str], governor: Any = None) -> str:
        """`gauges`: name -> (help, value) read at scrape time (queue depth, ready ...); `governor`:
        the engine's power/thermal governor (anything with `state()`), or None without one."""
        out: list[str] = []
        # read before taking our lock: the governor's own lock may be held by a sensor read
        gov_lines = governor_lines(governor)

        def metric(name: str, kind: str, help_: str, lines: list[str]) -> None:
            out.append(f"# HELP {name} {help_}")
            out.append(f"# TYPE {name} {kind}")
            out.extend(lines)

        with self._lock:
            labels = ",".join(f'{k}="{_label(v)}"' for k, v in sorted(info.items()))
            metric("edgespec_info", "gauge", "edgespec version and the model served", [f"edgespec_info{{{labels}}} 1"])
            metric(
                "edgespec_requests_total", "counter", "HTTP requests answered, by endpoint and status code",
                [f'edgespec_requests_total{{endpoint="{_label(e)}",status="{s}"}} {n}'
                 for (e, s), n in sorted(self.requests.items())],
            )
            for name, help_, value in (
                ("edgespec_prompt_tokens_total", "prompt tokens processed", self.prompt_tokens),
                ("edgespec_completion_tokens_total", "tokens generated", self.completion_tokens),
                ("edgespec_drafted_tokens_total", "tokens proposed by the drafter", self.drafted),
                ("edgespec_accepted_tokens_total", "drafted tokens the target accepted", self.accepted),
                ("edgespec_target_passes_total", "target model passes", self.target_passes),
                ("edgespec_generation_seconds_total", "seconds the engine spent generating", self.generation_seconds),
            ):
                metric(name, "counter", help_, [f"{name} {_num(value)}"])
            overall = self.accepted / self.drafted if self.drafted else None
            for name, help_, value in (
                ("edgespec_acceptance_rate", "accepted / drafted over all requests since start", overall),
                ("edgespec_last_acceptance_rate", "accepted / drafted of the last request that drafted", self.last_acceptance_rate),
                ("edgespec_tokens_per_second", "decode tokens per second of the last request", self.last_tokens_per_second),
                ("edgespec_energy_joules_per_token", "energy per generated token of the last request (power sensor)", self.last_energy_j_per_token),
            ):
                if value is not None:
                    metric(name, "gauge", help_, [f"{name} {_num(value)}"])
            for name, (help_, value) in gauges.items():
                metric(name, "gauge", help_, [f"{name} {_num(value)}"])
            out.extend(gov_lines)
            metric("edgespec_time_to_first_token_seconds", "histogram",
                   "request arrival to first generated text, queue wait included", self.ttft.lines("edgespec_time_to_first_token_seconds"))
            metric("edgespec_queue_wait_seconds", "histogram", "time a request waited for the engine",
                   self.queue_wait.lines("edgespec_queue_wait_seconds"))
            metric("edgespec_request_duration_seconds", "histogram", "request arrival to the last byte of the answer",
                   self.duration.lines("edgespec_request_duration_seconds"))
        return "\n".join(out) + "\n"


# (state key, metric name, kind, help); a value the board cannot measure (None) is left out, as
# Prometheus expects of an absent sensor, rather than written as 0
_GOVERNOR_METRICS = (
    ("level", "edgespec_governor_level", "gauge",
     "power/thermal rung: 0 normal, 1 small-k, 2 ngram-only, 3 fewer-cores, 4 paced"),
    ("power_w", "edgespec_power_watts", "gauge", "power the sensors cover, rolling 5 s average (Jetson: board input; Pi 5: core rails only, not the 5 V input)"),
    ("power_now_w", "edgespec_power_now_watts", "gauge", "power the sensors cover at the last read (see edgespec_power_watts)"),
    ("power_budget_w", "edgespec_power_budget_watts", "gauge", "the power budget the governor keeps to"),
    ("temp_c", "edgespec_temperature_celsius", "gauge", "hottest thermal zone the device profile counts"),
    ("max_temp_c", "edgespec_max_temperature_celsius", "gauge", "the temperature limit the governor keeps to"),
    ("throttled", "edgespec_throttled", "gauge", "1 while the firmware reports throttling or under-voltage"),
    ("energy_j_per_token", "edgespec_governor_energy_joules_per_token", "gauge",
     "board energy per generated token over the last 10 s of sensor samples"),
    ("energy_j", "edgespec_energy_joules_total", "counter", "board energy integrated while generating"),
    ("tokens", "edgespec_governor_tokens_total", "counter", "tokens the governor has counted"),
    ("pace_s", "edgespec_governor_pace_seconds", "gauge", "sleep after each round on the paced rung"),
    ("cores", "edgespec_governor_cores", "gauge", "cores the process is held to on the fewer-cores rung"),
    ("changes", "edgespec_governor_changes_total", "counter", "rung changes since start"),
)


def governor_lines(governor: Any) -> list[str]:
    """The governor's state as Prometheus lines ([] without a governor, or when reading it fails:
    a scrape must never fail because of a sensor)."""
    if governor is None or not hasattr(governor, "state"):
        return []
    try:
        st = governor.state()
    except Exception:  # noqa: BLE001 - a sensor problem shows as missing metrics, not a 500
        return []
    out: list[str] = []
    for key, name, kind, help_ in _GOVERNOR_METRICS:
        v = st.get(key)
        if v is None or (isinstance(v, float) and not math.isfinite(v)):
            continue
        out += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name} {_num(v)}"]
    name = "edgespec_governor_info"
    labels = {"level_name": st.get("level_name", ""), "cores_rung": st.get("cores_rung", ""),
              "reasons": "; ".join(st.get("reasons") or []), "unenforced": "; ".join(st.get("unenforced") or [])}
    text = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
    out += [f"# HELP {name} the governor's rung by name, why it is there, and limits it cannot enforce",
            f"# TYPE {name} gauge", f"{name}{{{text}}} 1"]
    return out


def memory_gauges(engine: Any) -> dict[str, tuple[str, float | int]]:
    """What the process holds that grows with use, for /metrics and scripts/soak.sh: its resident memory,
    the suffix indexes' tokens against their capacity (and what they have evicted: past zero, they
    are full), and the bounded caches' entries against theirs. Once every one of them has reached its
    capacity, resident memory should stop growing."""
    from ..models import template, template_process

    tokens, capacity, evicted, nbytes = _suffix_figures(engine)
    compiled = template.compiled.cache_info()
    gauges: dict[str, tuple[str, float | int]] = {
        "edgespec_suffix_index_tokens": ("tokens the suffix indexes hold (finished requests' text)", tokens),
        "edgespec_suffix_index_capacity_tokens": ("tokens the suffix indexes may hold (--suffix-capacity)", capacity),
        "edgespec_suffix_index_evicted_tokens": ("tokens the suffix indexes have evicted to stay within capacity",
                                                 evicted),
        "edgespec_suffix_index_bytes": ("bytes of the suffix indexes' buffers and automata", nbytes),
        "edgespec_template_cache_entries": ("compiled chat templates and their prices remembered",
                                            max(compiled.currsize, template_process.templates_priced())),
        "edgespec_template_cache_capacity": ("compiled chat templates remembered at most", compiled.maxsize or 0),
    }
    rss = resident_bytes()
    if rss is not None:
        gauges["edgespec_resident_memory_bytes"] = ("resident memory of the server process (VmRSS)", rss)
    return gauges


def _suffix_figures(engine: Any) -> tuple[int, int, int, int]:
    """(tokens, capacity, evicted, bytes) summed over the suffix indexes the engine's drafters report
    (ServedEngine.drafter_stats; none before an engine is loaded). They are read while the engine's
    thread may change them (a dict resized under the read is a RuntimeError): tried three times, then
    zeros - a scrape never fails because of them."""
    if engine is None:
        return 0, 0, 0, 0
    keys = ("index_tokens", "index_capacity", "index_evicted", "index_bytes")
    for _ in range(3):
        try:
            stats = list(engine.drafter_stats().values())
        except RuntimeError:
            continue
        t, c, e, b = (sum(int(st.get(k, 0)) for st in stats) for k in keys)
        return t, c, e, b
    return 0, 0, 0, 0


def resident_bytes() -> int | None:
    """This process's resident set (VmRSS), None where /proc cannot tell."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            return next((int(x.split()[1]) * 1024 for x in f if x.startswith("VmRSS:")), None)
    except (OSError, ValueError, IndexError):
        return None
