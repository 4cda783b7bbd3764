"""/metrics exposes the power/thermal governor: board power, temperature, J/token, the rung and why."""
from __future__ import annotations

from edgespec.edge import sensors
from edgespec.edge.governor import Governor, SMALL_K
from edgespec.server.metrics import Metrics, governor_lines


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


class Board:
    """Fake sensors: set power/temp; None = this board cannot measure it."""

    min_interval_s = 0.2

    def __init__(self, clock, power=None, temp=None, throttled=None):
        self.clock, self.power, self.temp, self.throttled = clock, power, temp, throttled
        self.has_power = power is not None
        self.has_temp = temp is not None

    def read(self):
        return sensors.Reading(t=self.clock(), power_w=self.power, temp_c=self.temp, throttled=self.throttled,
                               throttle_bits=None if self.throttled is None else int(self.throttled) * 4)


def samples(lines):
    """name{labels} -> value, for every sample line; each value must parse as a float."""
    out = {}
    for line in lines:
        if not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def run(gov, clock, seconds, tokens=2):
    for _ in range(int(seconds / 0.25)):
        gov.limits()
        gov.on_tokens(tokens)
        clock.t += 0.25


def test_governor_state_becomes_metrics_that_follow_the_board():
    clock = Clock()
    board = Board(clock, power=12.5, temp=71.0, throttled=False)
    gov = Governor(board, power_budget_w=10.0, max_temp_c=80.0, clock=clock, hold_s=1.0, limit_cores=False)
    run(gov, clock, 3)
    lines = governor_lines(gov)
    s = samples(lines)
    assert s["edgespec_power_watts"] == 12.5 and s["edgespec_power_budget_watts"] == 10.0
    assert s["edgespec_temperature_celsius"] == 71.0 and s["edgespec_max_temperature_celsius"] == 80.0
    assert s["edgespec_throttled"] == 0
    assert s["edgespec_governor_level"] >= SMALL_K  # 12.5 W over a 10 W budget for 3 s
    assert s["edgespec_governor_changes_total"] >= 1
    assert abs(s["edgespec_governor_energy_joules_per_token"] - 12.5 * 0.25 / 2) < 1e-6  # 12.5 W, 2 tokens / 0.25 s
    assert s["edgespec_energy_joules_total"] > 0 and s["edgespec_governor_tokens_total"] > 0
    info = [k for k in s if k.startswith("edgespec_governor_info{")]
    assert len(info) == 1
    assert 'level_name="small-k"' in info[0] or 'level_name="ngram-only"' in info[0]
    assert "power 12.5 W over budget 10 W" in info[0] and "cores_rung=\"skipped" in info[0]
    assert "# TYPE edgespec_energy_joules_total counter" in lines

    board.power, board.temp = 4.0, 50.0  # load drops: it climbs back down
    run(gov, clock, 60)
    s = samples(governor_lines(gov))
    assert s["edgespec_governor_level"] == 0 and s["edgespec_power_watts"] < 5.0


def test_what_a_board_cannot_measure_is_absent_not_zero():
    clock = Clock()
    gov = Governor(Board(clock, temp=55.0), power_budget_w=5.0, clock=clock)  # a Pi 4: no current sensing
    run(gov, clock, 1)
    s = samples(governor_lines(gov))
    assert "edgespec_power_watts" not in s and "edgespec_governor_energy_joules_per_token" not in s
    assert s["edgespec_temperature_celsius"] == 55.0
    info = next(k for k in s if k.startswith("edgespec_governor_info{"))
    assert "power budget 5 W: no power sensor on this board" in info  # the unenforced limit is visible


def test_a_failing_governor_never_breaks_a_scrape():
    class Broken:
        def state(self):
            raise OSError("i2c bus error")

    assert governor_lines(Broken()) == [] and governor_lines(None) == []
    text = Metrics().render({}, {"version": "x"}, governor=Broken())
    assert "edgespec_info" in text and "edgespec_governor" not in text


def test_metrics_endpoint_shows_the_engines_governor():
    from helpers.fake_server import FakeEngine, Server

    clock = Clock()
    eng = FakeEngine()
    eng.governor = Governor(Board(clock, power=7.0, temp=60.0), power_budget_w=10.0, clock=clock)
    run(eng.governor, clock, 1)
    s = Server(eng)
    try:
        text = s.get("/metrics")[2].decode()
    finally:
        s.stop()
    got = samples(text.splitlines())
    assert got["edgespec_power_watts"] == 7.0 and got["edgespec_governor_level"] == 0
    assert got["edgespec_ready"] == 1

    plain = Server(FakeEngine())  # no governor: no governor metrics
    try:
        assert "edgespec_governor" not in plain.get("/metrics")[2].decode()
    finally:
        plain.stop()
