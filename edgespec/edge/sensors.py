"""Power, temperature and throttling sensors, found by glob on the board's own files and tools.

Why globs: the hwmon number of the Jetson's INA3221 changes between JetPack releases and boots, and a
thermal zone's number says nothing about what it measures; the `name`/`type`/`inN_label` files do.
Every path is taken under a `root`, so tests run the same code on fake sysfs/procfs trees.

Sources:
  Jetson  /sys/bus/i2c/drivers/ina3221/*/hwmon/hwmon*/inN_label (VDD_IN, ...), inN_input (mV),
          currN_input (mA); `nvpmodel -q` for the power mode
  Pi 5    `vcgencmd pmic_read_adc` (per-rail volts and amps), `vcgencmd get_throttled`
  all     /sys/class/thermal/thermal_zone*/{type,temp} (millidegrees C)

A sensor that is missing is simply not in the set; one that fails to read gives None for that
reading and an entry in `Reading.errors`: nothing here raises to the caller.
"""
from __future__ import annotations

import glob
import logging
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("edgespec.edge.sensors")

INA3221_GLOB = "sys/bus/i2c/drivers/ina3221/*/hwmon/hwmon*"
HWMON_GLOB = "sys/class/hwmon/hwmon*"
THERMAL_GLOB = "sys/class/thermal/thermal_zone*"
# zones that report a constant or a non-die value on some boards
IGNORED_ZONES = ("PMIC-Die",)
# vcgencmd get_throttled: bits 0-3 describe now, 16-19 the same since boot
THROTTLE_BITS = {0: "under-voltage", 1: "arm frequency capped", 2: "throttled", 3: "soft temperature limit"}
COMMAND_TIMEOUT_S = 2.0


BOARD_INPUT = "board input"  # a rail measuring the board's supply (Jetson VDD_IN, POM_5V_IN)
RAIL_SUM = "sum of rails"  # hwmon rails without an input rail: part of the board
CORE_RAILS = "core rails"  # Pi 5 PMIC rails (EXT5V has no current): SoC, RAM, I/O, not the 5 V input
POWER_SCOPES = (BOARD_INPUT, RAIL_SUM, CORE_RAILS)


@dataclass
class Reading:
    """One sample of every sensor. `power_w` is whole-board input power when a total rail exists
    (Jetson VDD_IN), else the sum of the rails read; `power_scope` says which, in words shown with
    the number. On a Pi 5 the PMIC's rails are summed: its 5 V input (EXT5V) reports a voltage only
    in `pmic_read_adc`, so the sum covers the core rails, not the board's input (USB, fan, the PMIC's
    own losses are missing): it is named "core rails", never board power."""

    t: float
    power_w: float | None = None
    power_scope: str | None = None  # POWER_SCOPES value: what power_w covers
    temp_c: float | None = None  # hottest zone considered
    throttled: bool | None = None  # firmware is limiting the board right now
    throttle_bits: int | None = None
    rails_w: dict[str, float] = field(default_factory=dict)
    temps_c: dict[str, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "power_w": _round(self.power_w), "power_scope": self.power_scope, "temp_c": _round(self.temp_c), "throttled": self.throttled,
            "throttle_bits": None if self.throttle_bits is None else hex(self.throttle_bits),
            "throttle_reasons": throttle_reasons(self.throttle_bits) if self.throttle_bits is not None else [],
            "rails_w": {k: _round(v) for k, v in self.rails_w.items()},
            "temps_c": {k: _round(v) for k, v in self.temps_c.items()},
            "errors": list(self.errors),
        }


def _round(v, nd=3):
    return None if v is None else round(v, nd)


def throttle_reasons(bits: int | None, *, since_boot: bool = False) -> list[str]:
    if bits is None:
        return []
    shift = 16 if since_boot else 0
    return [name for b, name in THROTTLE_BITS.items() if bits & (1 << (b + shift))]


# --- individual sensors --------------------------------------------------------------------------
def _read_number(path: Path) -> float:
    text = path.read_text(encoding="ascii", errors="replace").strip()
    return float(text)


@dataclass
class HwmonRail:
    """One INA3221 channel: watts = inN_input (mV) x currN_input (mA) / 1e6."""

    label: str
    volt_path: Path
    curr_path: Path

    def read_w(self) -> float:
        mv = _read_number(self.volt_path)
        ma = _read_number(self.curr_path)
        return mv * ma / 1e6


@dataclass
class ThermalZone:
    name: str  # the zone's `type`, e.g. cpu-thermal
    path: Path  # .../thermal_zoneN/temp

    def read_c(self) -> float:
        return _read_number(self.path) / 1000.0


def run_tool(argv: list[str], timeout: float = COMMAND_TIMEOUT_S) -> str:
    """Runs a board tool (vcgencmd, nvpmodel) and returns its stdout; raises OSError on any failure."""
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError) as e:
        raise OSError(f"{' '.join(argv)}: {e}") from e
    if p.returncode != 0:
        msg = (p.stderr or p.stdout).strip().splitlines()
        raise OSError(f"{' '.join(argv)} exited {p.returncode}" + (f": {msg[0]}" if msg else ""))
    return p.stdout


_PMIC_RE = re.compile(r"^\s*(\S+?)_([AV])\s+(?:current|volt)\(\d+\)=\s*([-+0-9.eE]+)\s*[AV]\s*$")


def parse_pmic_read_adc(text: str) -> dict[str, float]:
    """`vcgencmd pmic_read_adc` lines like `VDD_CORE_A current(7)=2.30000000A` and
    `VDD_CORE_V volt(15)=0.80000000V` -> watts per rail that has both a current and a voltage."""
    amps: dict[str, float] = {}
    volts: dict[str, float] = {}
    for line in text.splitlines():
        m = _PMIC_RE.match(line)
        if not m:
            continue
        rail, kind, value = m.group(1), m.group(2), float(m.group(3))
        (amps if kind == "A" else volts)[rail] = value
    return {rail: volts[rail] * amps[rail] for rail in amps if rail in volts}


def parse_throttled(text: str) -> int:
    """`throttled=0x50005` -> 0x50005."""
    m = re.search(r"throttled\s*=\s*(0x[0-9a-fA-F]+|\d+)", text)
    if not m:
        raise ValueError(f"unexpected get_throttled output: {text.strip()[:80]!r}")
    return int(m.group(1), 0)


def parse_nvpmodel(text: str) -> dict:
    """`nvpmodel -q` prints `NV Power Mode: 15W` and then the mode id on its own line."""
    name = None
    mode_id = None
    for line in text.splitlines():
        line = line.strip()
        if line.lower().startswith("nv power mode"):
            name = line.split(":", 1)[1].strip()
        elif line.isdigit() and mode_id is None:
            mode_id = int(line)
    if name is None:
        raise ValueError(f"unexpected nvpmodel output: {text.strip()[:80]!r}")
    return {"name": name, "id": mode_id}


# --- the set of sensors of one board -------------------------------------------------------------
@dataclass
class Sensors:
    """Everything found on one board. `read()` samples all of them; it never raises."""

    rails: list[HwmonRail] = field(default_factory=list)
    total_rail: str | None = None  # label of the board-input rail (Jetson VDD_IN), if any
    zones: list[ThermalZone] = field(default_factory=list)
    vcgencmd: str | None = None  # path of the tool, when it answers pmic_read_adc / get_throttled
    vcgencmd_power: bool = False
    vcgencmd_throttle: bool = False
    nvpmodel: str | None = None
    clock: object = time.monotonic
    notes: list[str] = field(default_factory=list)  # what was looked for and not found

    @property
    def has_power(self) -> bool:
        return bool(self.rails) or self.vcgencmd_power

    @property
    def has_temp(self) -> bool:
        return bool(self.zones)

    @property
    def has_throttle(self) -> bool:
        return self.vcgencmd_throttle

    @property
    def min_interval_s(self) -> float:
        """How often a sample is worth taking: sysfs reads are microseconds, a vcgencmd call is a
        process start (~10 ms), so the governor samples those less often."""
        return 1.0 if (self.vcgencmd_power or self.vcgencmd_throttle) else 0.2

    def read(self) -> Reading:
        r = Reading(t=self.clock())
        for rail in self.rails:
            try:
                r.rails_w[rail.label] = rail.read_w()
            except (OSError, ValueError) as e:
                r.errors.append(f"power rail {rail.label}: {_short(e)}")
        if self.rails:
            if self.total_rail and self.total_rail in r.rails_w:
                r.power_w, r.power_scope = r.rails_w[self.total_rail], BOARD_INPUT
            elif not self.total_rail and r.rails_w:
                r.power_w, r.power_scope = sum(r.rails_w.values()), RAIL_SUM
        if self.vcgencmd_power and self.vcgencmd:
            try:
                pmic = parse_pmic_read_adc(run_tool([self.vcgencmd, "pmic_read_adc"]))
                if not pmic:
                    raise ValueError("no rails in pmic_read_adc output")
                r.rails_w.update({f"pmic:{k}": v for k, v in pmic.items()})
                r.power_w, r.power_scope = sum(pmic.values()), CORE_RAILS
            except (OSError, ValueError) as e:
                r.errors.append(f"vcgencmd pmic_read_adc: {_short(e)}")
        for zone in self.zones:
            try:
                c = zone.read_c()
            except (OSError, ValueError) as e:
                r.errors.append(f"thermal zone {zone.name}: {_short(e)}")
                continue
            if -40.0 <= c <= 150.0:  # outside this a zone is reporting an error code, not a temperature
                r.temps_c[zone.name] = c
            else:
                r.errors.append(f"thermal zone {zone.name}: implausible {c:.1f} C ignored")
        if r.temps_c:
            r.temp_c = max(r.temps_c.values())
        if self.vcgencmd_throttle and self.vcgencmd:
            try:
                bits = parse_throttled(run_tool([self.vcgencmd, "get_throttled"]))
                r.throttle_bits = bits
                r.throttled = bool(bits & 0xF)
            except (OSError, ValueError) as e:
                r.errors.append(f"vcgencmd get_throttled: {_short(e)}")
        return r

    def power_mode(self) -> dict | None:
        """Jetson nvpmodel mode {"name": "15W", "id": 0}, or None where there is no nvpmodel."""
        if not self.nvpmodel:
            return None
        try:
            return parse_nvpmodel(run_tool([self.nvpmodel, "-q"]))
        except (OSError, ValueError) as e:
            return {"name": None, "id": None, "error": _short(e)}

    def describe(self) -> dict:
        return {
            "power_rails": [r.label for r in self.rails] + (["vcgencmd pmic_read_adc"] if self.vcgencmd_power else []),
            "total_rail": self.total_rail,
            "thermal_zones": [z.name for z in self.zones],
            "throttle": "vcgencmd get_throttled" if self.vcgencmd_throttle else None,
            "nvpmodel": self.nvpmodel,
            "notes": list(self.notes),
        }


def _short(e: Exception) -> str:
    s = str(e).strip().splitlines()
    return s[0] if s else type(e).__name__


def _under(root: Path, pattern: str) -> list[Path]:
    return [Path(p) for p in sorted(glob.glob(str(root / pattern)))]


def find_ina3221(root: Path, patterns=(INA3221_GLOB,)) -> list[HwmonRail]:
    """Every labelled channel of every INA3221 (glob; never a fixed hwmon number). Besides the
    driver path, any hwmon whose `name` is ina3221 counts (older kernels expose only that)."""
    dirs: list[Path] = []
    for pat in patterns:
        dirs += _under(root, pat)
    for d in _under(root, HWMON_GLOB):
        try:
            if (d / "name").read_text().strip() == "ina3221":
                dirs.append(d)
        except OSError:
            pass
    rails: list[HwmonRail] = []
    seen: set[str] = set()
    for d in dirs:
        key = os.path.realpath(d)
        if key in seen:
            continue
        seen.add(key)
        for label_file in sorted(d.glob("in*_label")):
            m = re.fullmatch(r"in(\d+)_label", label_file.name)
            if not m:
                continue
            n = m.group(1)
            try:
                label = label_file.read_text(encoding="ascii", errors="replace").strip()
            except OSError:
                continue
            volt, curr = d / f"in{n}_input", d / f"curr{n}_input"
            if label and volt.exists() and curr.exists() and label.upper() != "NC":
                rails.append(HwmonRail(label, volt, curr))
    return rails


def find_thermal_zones(root: Path, prefer: list[str] | None = None) -> list[ThermalZone]:
    """Zones by their `type`; with `prefer` (from the device profile) only those types are kept,
    when any of them exist."""
    zones = []
    for d in _under(root, THERMAL_GLOB):
        try:
            name = (d / "type").read_text(encoding="ascii", errors="replace").strip()
        except OSError:
            continue
        if name in IGNORED_ZONES or not (d / "temp").exists():
            continue
        zones.append(ThermalZone(name or d.name, d / "temp"))
    if prefer:
        chosen = [z for z in zones if z.name in prefer]
        if chosen:
            return chosen
    return zones


def discover(root: str | os.PathLike = "/", *, profile=None, path: str | None = None, clock=time.monotonic) -> Sensors:
    """Finds the board's sensors. `path` is the PATH searched for vcgencmd/nvpmodel (tests put fake
    tools there); `profile` (a devices.DeviceProfile) may name the total rail and preferred zones."""
    root = Path(root)
    rules = dict(getattr(profile, "sensors", None) or {})
    s = Sensors(clock=clock)
    s.rails = find_ina3221(root, tuple(rules.get("ina3221_globs", [INA3221_GLOB])))
    labels = [r.label for r in s.rails]
    for candidate in rules.get("total_rails", ["VDD_IN", "POM_5V_IN"]):
        if candidate in labels:
            s.total_rail = candidate
            break
    if s.rails and not s.total_rail:
        s.notes.append(f"no board-input rail among {labels}: power is the sum of the rails")
    s.zones = find_thermal_zones(root, rules.get("thermal_zones"))
    if not s.zones:
        s.notes.append(f"no thermal zones under {root / THERMAL_GLOB}")
    search = path if path is not None else os.environ.get("PATH", "")
    vc = shutil.which("vcgencmd", path=search)
    if vc and rules.get("vcgencmd", True):
        s.vcgencmd = vc
        try:
            s.vcgencmd_power = bool(parse_pmic_read_adc(run_tool([vc, "pmic_read_adc"])))
        except (OSError, ValueError) as e:
            s.notes.append(f"vcgencmd pmic_read_adc unavailable ({_short(e)}): no power reading (Pi 4 and older have none)")
        try:
            parse_throttled(run_tool([vc, "get_throttled"]))
            s.vcgencmd_throttle = True
        except (OSError, ValueError) as e:
            s.notes.append(f"vcgencmd get_throttled unavailable ({_short(e)})")
    nv = shutil.which("nvpmodel", path=search)
    if nv:
        s.nvpmodel = nv
    return s
