"""The power/thermal governor on fake sensors and a fake clock: the ladder, hysteresis, sensors
missing or failing, energy per token, a simulated board held to its power budget, and the real
CPU-affinity mechanism behind the "fewer cores" rung."""
from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

from edgespec.edge import governor as gv
from edgespec.edge import sensors
from edgespec.errors import InvalidRequest
from edgespec.edge.governor import FEWER_CORES, NGRAM, NORMAL, PACED, SMALL_K, AffinityLimiter, Governor, Limits

FAKES = Path(__file__).parents[1] / "fakes"


class Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


class FakeSensors(gv.SensorSource):
    """Readings set by the test; `fail` makes read() raise like a broken driver would."""

    has_power = True
    has_temp = True
    min_interval_s = 0.2

    def __init__(self, clock, power=5.0, temp=50.0, throttled=None, bits=None):
        self.clock, self.power, self.temp, self.throttled, self.bits = clock, power, temp, throttled, bits
        self.fail = False
        self.reads = 0

    def read(self):
        self.reads += 1
        if self.fail:
            raise OSError("i2c bus error")
        return sensors.Reading(t=self.clock(), power_w=self.power, temp_c=self.temp, throttled=self.throttled,
                               throttle_bits=self.bits)


class FakeLimiter(gv.CpuLimiter):
    def __init__(self, cores=4):
        self.original = list(range(cores))
        self.calls: list = []

    @property
    def available(self):
        return len(self.original) >= 2

    def limit(self, n):
        self.calls.append(("limit", n))
        return n

    def restore(self):
        self.calls.append(("restore",))


def make(power=5.0, temp=50.0, **kw):
    clock = Clock()
    s = FakeSensors(clock, power=power, temp=temp)
    lim = kw.pop("cpu_limiter", FakeLimiter())
    g = Governor(s, clock=clock, cpu_limiter=lim, **kw)
    return g, s, clock, lim


def run_for(g, clock, seconds, step=0.1, tokens=3):
    """Rounds of `step` seconds, each producing `tokens` tokens; returns the limits seen."""
    seen = []
    for _ in range(int(round(seconds / step))):
        lim = g.limits()
        seen.append(lim)
        clock.advance(step + lim.pace_s)
        g.on_tokens(tokens)
    return seen


def test_within_budget_nothing_changes():
    g, s, clock, lim = make(power=8.0, power_budget_w=10.0, max_temp_c=80)
    seen = run_for(g, clock, 30)
    assert all(x == Limits() for x in seen)
    assert g.state()["level_name"] == "normal" and g.state()["reasons"] == []
    assert lim.calls == []


def test_power_over_budget_climbs_the_ladder_in_order_one_rung_per_hold():
    g, s, clock, lim = make(power=15.0, power_budget_w=10.0, hold_s=2.0)
    levels = []
    for _ in range(120):  # 12 s
        levels.append(g.limits().level)
        clock.advance(0.1)
    firsts = {lv: levels.index(lv) for lv in set(levels)}
    assert sorted(firsts, key=firsts.get) == [NORMAL, SMALL_K, NGRAM, FEWER_CORES, PACED]
    gaps = [b - a for a, b in zip(sorted(firsts.values()), sorted(firsts.values())[1:])]
    assert all(gap >= 20 for gap in gaps[1:]), gaps  # >= hold_s (20 rounds of 0.1 s) between rungs
    lims = g.limits()
    assert lims.max_k == 2 and lims.drafting == "ngram" and lims.pace_s > 0 and lims.cores == 2
    assert lim.calls == [("limit", 2)]
    assert "power" in g.state()["reasons"][0] and "over budget 10 W" in g.state()["reasons"][0]


def test_pacing_grows_while_still_over_and_is_capped():
    g, s, clock, lim = make(power=30.0, power_budget_w=10.0, hold_s=1.0, max_pace_s=0.5)
    run_for(g, clock, 60)
    assert g.level == PACED
    assert g.limits().pace_s == pytest.approx(0.5)


def test_relaxes_slowly_after_the_load_drops_and_gives_cores_back():
    g, s, clock, lim = make(power=15.0, power_budget_w=10.0, hold_s=1.0, relax_s=5.0)
    run_for(g, clock, 8)
    assert g.level >= FEWER_CORES
    s.power = 6.0  # well under 0.9 x budget
    t0 = clock()
    levels = []
    while g.level != NORMAL and clock() - t0 < 200:
        g.limits()
        levels.append(g.level)
        clock.advance(0.1)
    assert g.level == NORMAL
    assert ("restore",) in lim.calls
    # never faster than relax_s per step down (the rolling average also needs to come down first)
    assert clock() - t0 >= 5.0 * 3


def test_hysteresis_no_relaxing_just_under_the_budget():
    g, s, clock, lim = make(power=12.0, power_budget_w=10.0, hold_s=1.0, relax_s=2.0)
    run_for(g, clock, 3)
    lv = g.level
    assert lv >= SMALL_K
    s.power = 9.5  # under the budget but above 0.9 x budget
    run_for(g, clock, 30)  # the rolling average comes down from 12 W (it may climb a rung meanwhile)
    lv = g.level
    assert g.power_w == pytest.approx(9.5, abs=0.05)
    run_for(g, clock, 120)
    assert g.level == lv  # no relaxing: 9.5 W is above 0.9 x 10 W


def test_temperature_over_limit_cuts_drafting_first():
    g, s, clock, lim = make(temp=86.0, max_temp_c=80.0, hold_s=1.0)
    run_for(g, clock, 1.5)
    lims = g.limits()
    assert lims.max_k == 2 and lims.pace_s == 0
    assert "temperature 86.0 C over limit 80 C" in g.state()["reasons"][0]
    s.temp = 77.0  # under the limit but inside the 5 C margin: hold
    run_for(g, clock, 30)
    assert g.level >= SMALL_K
    s.temp = 60.0
    run_for(g, clock, 60)
    assert g.level == NORMAL


def test_throttled_bit_is_a_reason_to_back_off_unless_disabled():
    for react, expect in ((True, True), (False, False)):
        g, s, clock, lim = make(hold_s=1.0, react_to_throttle=react)
        s.throttled, s.bits = True, 0x4
        run_for(g, clock, 3)
        assert (g.level > NORMAL) is expect
        if expect:
            assert "firmware reports throttled" in g.state()["reasons"][0]


def test_no_power_sensor_means_budget_not_enforced_but_requests_run(caplog):
    clock = Clock()
    s = FakeSensors(clock, power=None)
    s.has_power = False
    with caplog.at_level("WARNING", logger="edgespec.edge.governor"):
        g = Governor(s, power_budget_w=5.0, clock=clock, cpu_limiter=FakeLimiter())
    assert any("no power sensor" in r.message for r in caplog.records)
    seen = run_for(g, clock, 20)
    assert all(x.level == NORMAL for x in seen)
    st = g.state()
    assert st["power_w"] is None and st["energy_j_per_token"] is None
    assert "no power sensor" in st["unenforced"][0]


def test_sensor_read_raising_never_reaches_the_caller():
    g, s, clock, lim = make(power=15.0, power_budget_w=10.0, hold_s=1.0)
    run_for(g, clock, 1.5)
    lv = g.level
    s.fail = True
    seen = run_for(g, clock, 10)
    assert all(isinstance(x, Limits) for x in seen)
    assert g.state()["sensor_errors"] == ["sensors: i2c bus error"]
    assert g.level >= lv  # the last good reading still counts for a while (stale_s)


def test_a_sensor_gone_for_longer_than_stale_s_stops_counting():
    g, s, clock, lim = make(temp=90.0, max_temp_c=80.0, hold_s=1.0, relax_s=2.0, stale_s=10.0)
    run_for(g, clock, 3)
    assert g.level > NORMAL
    s.temp = None  # zone unreadable from now on
    run_for(g, clock, 9)
    held = g.level
    assert held > NORMAL  # still trusting the last reading
    run_for(g, clock, 60)
    assert g.level == NORMAL  # no reading for > stale_s: it no longer holds the board back


def test_sensor_reads_are_cached_between_rounds():
    g, s, clock, lim = make(power=5.0, power_budget_w=10.0)
    for _ in range(100):
        g.limits()
        clock.advance(0.01)  # 1 s of 10 ms rounds
    assert s.reads <= 6  # every 0.2 s, not every round


def test_energy_per_token_and_per_request():
    g, s, clock, lim = make(power=10.0, power_budget_w=50.0)
    mark = g.mark()
    run_for(g, clock, 10, step=0.1, tokens=5)  # 50 tokens/s at 10 W -> 0.2 J/token
    assert g.energy_j_per_token == pytest.approx(0.2, rel=0.05)
    assert g.j_per_token_since(mark) == pytest.approx(0.2, rel=0.05)
    assert g.state()["energy_j"] == pytest.approx(100.0, rel=0.05)
    assert g.power_w == pytest.approx(10.0)


def test_idle_gaps_are_not_charged_to_tokens():
    g, s, clock, lim = make(power=10.0)
    run_for(g, clock, 5, tokens=5)
    e = g.energy_j
    clock.advance(600)  # ten idle minutes between requests
    run_for(g, clock, 0.4, tokens=5)
    assert g.energy_j - e < 10.0 * 1.0


def test_simulated_board_is_held_to_its_power_budget():
    """A board whose power follows what the governor allows: 14 W at full speculation, less with
    smaller k / n-gram only / half the cores, and less again in proportion to the time spent
    paused. Budget 8 W: the rolling power must settle at or below it and tokens must keep coming."""
    clock = Clock()
    s = FakeSensors(clock, power=14.0)
    g = Governor(s, power_budget_w=8.0, clock=clock, cpu_limiter=FakeLimiter(), hold_s=1.0, relax_s=6.0)
    active = {NORMAL: 14.0, SMALL_K: 12.5, NGRAM: 11.0, FEWER_CORES: 9.5, PACED: 9.5}
    idle_w = 3.0
    powers, tokens = [], []
    ungoverned = 14.0
    for _ in range(6000):  # 10 minutes of 0.1 s rounds
        lim = g.limits()
        busy = 0.1
        # power over this round: busy at the active power, paused at idle power
        p = (active[lim.level] * busy + idle_w * lim.pace_s) / (busy + lim.pace_s)
        s.power = p
        clock.advance(busy + lim.pace_s)
        n = 3 if lim.level < NGRAM else 2
        g.on_tokens(n)
        powers.append((busy + lim.pace_s, p))
        tokens.append(n)
    settled = powers[len(powers) // 3:]
    avg = sum(dt * p for dt, p in settled) / sum(dt for dt, _ in settled)
    assert avg <= 8.0 * 1.03, avg
    assert avg < ungoverned
    assert all(n > 0 for n in tokens)  # never stopped producing tokens
    assert g.level == PACED  # 9.5 W even on fewer cores: only pacing gets under 8 W


@pytest.mark.parametrize("text, watts", [("10W", 10.0), ("7.5 W", 7.5), (12, 12.0), ("15", 15.0)])
def test_parse_watts(text, watts):
    assert gv.parse_watts(text) == watts


@pytest.mark.parametrize("bad", ["ten watts", "-3W", "0", "W", True, "nanW"])
def test_parse_watts_rejects(bad):
    with pytest.raises(InvalidRequest) as e:
        gv.parse_watts(bad)
    assert e.value.param == "power_budget"


def test_parse_celsius():
    assert gv.parse_celsius("80C") == 80.0 and gv.parse_celsius("75°C") == 75.0 and gv.parse_celsius(70) == 70.0
    for bad in ("hot", "200C", "-5"):
        with pytest.raises(InvalidRequest):
            gv.parse_celsius(bad)


def test_constructor_rejects_nonsense_limits():
    with pytest.raises(ValueError):
        Governor(None, power_budget_w=0)
    with pytest.raises(ValueError):
        Governor(None, max_temp_c=500)


def test_from_options_on_fake_jetson(tmp_path, monkeypatch):
    root = tmp_path / "nano"
    shutil.copytree(FAKES / "jetson-orin-nano", root)
    monkeypatch.setenv("PATH", f"{root / 'usr/sbin'}{os.pathsep}{os.environ['PATH']}")
    clock = Clock()
    g = gv.from_options(power_budget="4W", max_temp="80C", root=str(root), clock=clock, spinning=False)
    g.cpu_limiter = FakeLimiter()
    assert g.power_budget_w == 4.0 and g.max_temp_c == 80.0 and g.unenforced == []
    run_for(g, clock, 1)
    assert g.power_w == pytest.approx(5064 * 1032 / 1e6)  # VDD_IN from the fake INA3221
    run_for(g, clock, 5)
    assert g.level > NORMAL  # 5.2 W is over the 4 W budget


# --- the real mechanism behind the fewer-cores rung -------------------------------------------
needs_two_cores = pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2, reason="needs >= 2 usable cores")


@needs_two_cores
def test_affinity_limiter_moves_every_thread_and_restores():
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, daemon=True)
    t.start()
    lim = AffinityLimiter()
    original = set(lim.original)
    try:
        assert lim.limit(1) == 1
        assert os.sched_getaffinity(t.native_id) == {lim.original[0]}
        assert os.sched_getaffinity(0) == {lim.original[0]}
        # a thread started while limited inherits the mask
        t2 = threading.Thread(target=stop.wait, daemon=True)
        t2.start()
        assert os.sched_getaffinity(t2.native_id) == {lim.original[0]}
    finally:
        lim.restore()
        stop.set()
    assert os.sched_getaffinity(0) == original
    assert os.sched_getaffinity(t.native_id) == original


@needs_two_cores
def test_affinity_limit_holds_every_thread_of_an_onnxruntime_pool(tmp_path):
    """onnxruntime's intra-op threads are fixed at session creation; affinity still holds them: after
    limit(1) every thread of the process, the pool's included, may run on one core only, so the
    process cannot burn more than one core-second per second (the kernel enforces it; the test checks
    the masks, not a timing), and threads the pool starts afterwards inherit the mask."""
    import onnxruntime as ort

    from edgespec.edge.providers import probe_model_bytes, session_options

    n = 512
    model = probe_model_bytes(n)
    sess = ort.InferenceSession(model, session_options(2), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((1, n), dtype=np.float32)
    w = np.random.default_rng(1).standard_normal((n, n), dtype=np.float32)
    sess.run(None, {"X": x, "W": w})
    lim = AffinityLimiter()

    def masks() -> dict[int, set[int]]:
        return {int(t): os.sched_getaffinity(int(t)) for t in os.listdir("/proc/self/task")}

    assert len(masks()) >= 2  # the pool's thread exists (2 intra-op threads: the caller + one)
    try:
        lim.limit(1)
        sess.run(None, {"X": x, "W": w})  # the pool works while held
        held = masks()
    finally:
        lim.restore()
    one = {lim.original[0]}
    assert all(m == one for m in held.values()), held
    assert all(m == set(lim.original) for m in masks().values())


def test_governor_skips_the_cores_rung_when_sessions_spin():
    g, s, clock, lim = make(power=20.0, power_budget_w=10.0, hold_s=1.0, limit_cores=False)
    levels = [x.level for x in run_for(g, clock, 10)]
    assert FEWER_CORES not in levels and PACED in levels
    assert lim.calls == []


def test_from_options_uses_the_cores_rung_only_without_spinning():
    assert gv.from_options(power_budget=5, spinning=False).limit_cores is True
    assert gv.from_options(power_budget=5, spinning=True).limit_cores is False
    assert gv.from_options(power_budget=5).limit_cores is False  # unknown: assume onnxruntime's default (spinning)


def test_governor_skips_the_cores_rung_on_a_single_core():
    g, s, clock, lim = make(power=20.0, power_budget_w=10.0, hold_s=1.0, cpu_limiter=FakeLimiter(cores=1))
    levels = [x.level for x in run_for(g, clock, 10)]
    assert FEWER_CORES not in levels and PACED in levels
    assert lim.calls == []


def test_close_gives_cores_back():
    g, s, clock, lim = make(power=20.0, power_budget_w=10.0, hold_s=0.5)
    run_for(g, clock, 3)
    assert g.cores == 2
    g.close()
    assert lim.calls[-1] == ("restore",) and g.cores is None


# --- with the real engine ----------------------------------------------------------------------
def test_engine_under_a_governor_keeps_its_output_and_never_aborts(tiny_bundle):
    """A board far over its budget: every round climbs a rung (hold_s=0), through small k, n-gram
    only, fewer cores and pacing. The text must be exactly the target-alone text, every token must
    be reported to the governor, and the request must finish normally."""
    from edgespec.engine import Engine

    eng = Engine.open(tiny_bundle, draft="model", verify=False)
    try:
        alone = eng.generate("one two three four", max_new_tokens=40, draft="none")
        clock = Clock()
        s = FakeSensors(clock, power=100.0)
        lim = FakeLimiter()
        gov = Governor(s, power_budget_w=1.0, clock=clock, cpu_limiter=lim, hold_s=0.0, sample_interval_s=0.0,
                       min_pace_s=0.0005, max_pace_s=0.001)
        real_limits = gov.limits
        seen = []

        def limits():
            clock.advance(0.05)
            lim_ = real_limits()
            seen.append(lim_)
            return lim_

        gov.limits = limits
        eng.governor = gov
        r = eng.generate("one two three four", max_new_tokens=40, draft="model", k=4)
        assert r.token_ids == alone.token_ids
        assert r.finish_reason == alone.finish_reason
        assert {x.level for x in seen} >= {SMALL_K, NGRAM, FEWER_CORES, PACED}
        assert all(x.max_k in (None, 2) for x in seen)
        assert gov.tokens == len(r.token_ids) - 1  # every token after the prefill's first came from a round
        assert lim.calls[0] == ("limit", 2)
        assert r.stats.energy_j_per_token is not None and r.stats.energy_j_per_token > 0
    finally:
        eng.governor = None
        eng.close()


def test_state_says_whether_the_cores_rung_is_used_and_why_not(caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="edgespec.edge.governor"):
        g, *_ = make(power_budget_w=10.0, limit_cores=False)
    assert g.state()["cores_rung"].startswith("skipped: the sessions' thread pool spins")
    assert any("fewer-cores rung is skipped" in r.getMessage() for r in caplog.records)
    g, *_ = make(power_budget_w=10.0, cpu_limiter=FakeLimiter(cores=1))
    assert g.state()["cores_rung"].startswith("skipped: fewer than 2 cores")
    g, *_ = make(power_budget_w=10.0)
    assert g.state()["cores_rung"] == "available"


def test_engine_tells_the_governor_its_shared_pool_spins(tiny_bundle):
    """Target + draft share onnxruntime's global pool, whose spinning cannot be turned off from
    Python: the governor must not plan on the fewer-cores rung."""
    from edgespec.edge import providers
    from edgespec.engine import Engine

    eng = Engine.open(tiny_bundle, draft="model", power_budget="5W", verify=False, warmup=False)
    try:
        assert providers.shared_pool_active()
        assert eng.governor.limit_cores is False and eng.governor.power_budget_w == 5.0
        assert "spins" in eng.governor.state()["cores_rung"]
    finally:
        eng.close()


def test_what_the_engine_reports_about_spinning_without_the_shared_pool(monkeypatch):
    """Where the shared pool cannot be had, two models get per-session pools without spinning
    (engine/build.load_runner): the fewer-cores rung pays there. A model alone keeps onnxruntime's
    default, spinning. (A process that already has the global pool cannot make per-session pools
    at all, so this is checked on the decision itself.)"""
    from edgespec.edge import providers
    from edgespec.engine import build

    monkeypatch.setattr(providers, "_shared_pool", {"ok": False})
    assert build.sessions_spin(load_draft=True) is False
    assert build.sessions_spin(load_draft=False) is True
    monkeypatch.setattr(providers, "_shared_pool", {"ok": True})
    assert build.sessions_spin(load_draft=True) is True and build.sessions_spin(load_draft=False) is True
