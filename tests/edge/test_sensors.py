"""Sensors found by glob on fake Jetson/Pi trees (real file layout) and fake vcgencmd/nvpmodel tools."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from edgespec.edge import sensors

FAKES = Path(__file__).parents[1] / "fakes"


def tools_path(root: Path) -> str:
    return f"{root / 'usr/bin'}{os.pathsep}{root / 'usr/sbin'}"


@pytest.fixture
def nano(tmp_path) -> Path:
    dst = tmp_path / "nano"
    shutil.copytree(FAKES / "jetson-orin-nano", dst)
    return dst


@pytest.fixture
def pi5(tmp_path) -> Path:
    dst = tmp_path / "pi5"
    shutil.copytree(FAKES / "rpi5", dst)
    return dst


HW = "sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon1"


def test_jetson_rails_by_label_and_board_input_power(nano):
    s = sensors.discover(nano, path="")
    assert [r.label for r in s.rails] == ["VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"]  # in7 has no current: skipped
    assert s.total_rail == "VDD_IN"
    r = s.read()
    assert r.power_w == pytest.approx(5064 * 1032 / 1e6)
    assert r.rails_w["VDD_SOC"] == pytest.approx(5056 * 640 / 1e6)
    assert r.temp_c == pytest.approx(47.281)
    assert r.errors == []


def test_hwmon_number_is_globbed_not_fixed(nano):
    hw = nano / HW
    hw.rename(hw.parent / "hwmon7")
    s = sensors.discover(nano, path="")
    assert s.total_rail == "VDD_IN" and s.read().power_w == pytest.approx(5.226048)


def test_agx_orin_has_no_input_rail_so_rails_are_summed():
    s = sensors.discover(FAKES / "jetson-agx-orin", path="")
    assert s.total_rail is None
    assert "NC" not in [r.label for r in s.rails]
    want = (4984 * 1672 + 4984 * 556 + 4992 * 880 + 4992 * 240) / 1e6
    assert s.read().power_w == pytest.approx(want)


def test_thermal_zone_unreadable_or_implausible_is_reported_not_raised(nano):
    (nano / "sys/class/thermal/thermal_zone8/temp").write_text("-273000\n")  # tj-thermal: an error code
    (nano / "sys/class/thermal/thermal_zone0/temp").write_text("garbage\n")  # cpu-thermal
    s = sensors.discover(nano, path="")
    r = s.read()
    assert "tj-thermal" not in r.temps_c and "cpu-thermal" not in r.temps_c
    assert r.temp_c == pytest.approx(46.812)  # soc0, the hottest of the rest
    assert any("tj-thermal" in e and "implausible" in e for e in r.errors)
    assert any("cpu-thermal" in e for e in r.errors)


def test_power_sensor_disappearing_mid_run(nano):
    s = sensors.discover(nano, path="")
    assert s.read().power_w is not None
    (nano / HW / "in1_input").unlink()
    r = s.read()
    assert r.power_w is None  # the board-input rail is gone: no guessing from sub-rails
    assert any("VDD_IN" in e for e in r.errors)


def test_nvpmodel_power_mode(nano):
    s = sensors.discover(nano, path=tools_path(nano))
    assert s.power_mode() == {"name": "15W", "id": 0}
    (nano / "usr/share/fake-tools/nvpmodel-q").write_text("garbage\n")
    pm = s.power_mode()
    assert pm["name"] is None and "unexpected nvpmodel output" in pm["error"]


def test_pi5_power_from_pmic_and_throttle_bits(pi5):
    s = sensors.discover(pi5, path=tools_path(pi5))
    assert s.has_power and s.has_throttle and s.has_temp
    assert s.min_interval_s >= 1.0  # a process per read: sampled less often
    r = s.read()
    want = sum(sensors.parse_pmic_read_adc((pi5 / "usr/share/fake-tools/pmic_read_adc").read_text()).values())
    assert r.power_w == pytest.approx(want)
    assert r.rails_w["pmic:VDD_CORE"] == pytest.approx(2.7178 * 0.880546)
    assert "pmic:EXT5V" not in r.rails_w  # a voltage without a current is not a rail's power
    assert r.throttled is False and r.throttle_bits == 0
    (pi5 / "usr/share/fake-tools/get_throttled").write_text("throttled=0x20004\n")
    r = s.read()
    assert r.throttled is True
    assert sensors.throttle_reasons(r.throttle_bits) == ["throttled"]
    assert sensors.throttle_reasons(r.throttle_bits, since_boot=True) == ["arm frequency capped"]


def test_pi5_without_vcgencmd_on_path(pi5):
    s = sensors.discover(pi5, path="")
    assert not s.has_power and not s.has_throttle
    assert s.has_temp


def test_pi4_has_throttle_but_no_power():
    root = FAKES / "rpi4"
    s = sensors.discover(root, path=tools_path(root))
    assert not s.has_power and s.has_throttle
    assert any("pmic_read_adc unavailable" in n for n in s.notes)
    r = s.read()
    assert r.power_w is None and r.throttled is True
    assert sensors.throttle_reasons(r.throttle_bits) == ["under-voltage", "throttled"]


def test_vcgencmd_failing_or_hanging_after_discovery(pi5, monkeypatch):
    s = sensors.discover(pi5, path=tools_path(pi5))
    (pi5 / "usr/share/fake-tools/pmic_read_adc").unlink()
    r = s.read()
    assert r.power_w is None and any("pmic_read_adc" in e for e in r.errors)
    tool = pi5 / "usr/bin/vcgencmd"
    tool.write_text("#!/bin/sh\nsleep 5\n")
    monkeypatch.setattr(sensors, "COMMAND_TIMEOUT_S", 0.3)
    monkeypatch.setattr(sensors.run_tool, "__defaults__", (0.3,))
    r = s.read()
    assert r.throttled is None and any("get_throttled" in e for e in r.errors)


def test_no_sensors_at_all(tmp_path):
    s = sensors.discover(tmp_path, path="")
    assert not (s.has_power or s.has_temp or s.has_throttle)
    r = s.read()
    assert r.power_w is None and r.temp_c is None and r.throttled is None and r.errors == []


@pytest.mark.parametrize("text", ["", "throttled=", "hello"])
def test_parse_throttled_rejects_garbage(text):
    with pytest.raises(ValueError):
        sensors.parse_throttled(text)


def test_parse_throttled_values():
    assert sensors.parse_throttled("throttled=0x50005\n") == 0x50005
    assert sensors.parse_throttled("throttled=0") == 0


def test_pi5_pmic_sum_is_named_core_rails_not_board_power(pi5):
    """EXT5V (the 5 V input) has a voltage only: the PMIC sum covers the core rails, and says so."""
    r = sensors.discover(pi5, path=tools_path(pi5)).read()
    assert r.power_scope == sensors.CORE_RAILS and r.to_dict()["power_scope"] == "core rails"


def test_jetson_vdd_in_is_board_input_and_a_rail_sum_says_so(tmp_path):
    """VDD_IN measures the board's supply: "board input"; rails without it: "sum of rails"."""
    root = tmp_path / "j"
    shutil.copytree(FAKES / "jetson-orin-nano", root)
    r = sensors.discover(root).read()
    assert r.power_scope == sensors.BOARD_INPUT
