"""Device profiles (devices/*.json) and board detection on fake procfs/sysfs trees."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from edgespec.edge import devices
from edgespec.errors import InvalidRequest

FAKES = Path(__file__).parents[1] / "fakes"
GIB = 1 << 30


def copy_tree(name: str, tmp_path: Path) -> Path:
    dst = tmp_path / name
    shutil.copytree(FAKES / name, dst, symlinks=True)
    return dst


def set_memtotal(root: Path, kib: int) -> None:
    p = root / "proc/meminfo"
    lines = [f"MemTotal:       {kib} kB" if ln.startswith("MemTotal:") else ln for ln in p.read_text().splitlines()]
    p.write_text("\n".join(lines) + "\n")


def test_every_board_of_the_issue_has_a_profile():
    ids = set(devices.profiles())
    assert {"jetson-orin-nano-8gb", "jetson-orin-nx-16gb", "jetson-agx-orin-64gb", "rpi5-4gb", "rpi5-8gb",
            "rpi5-16gb", "rpi4", "generic-x86_64", "generic-aarch64"} <= ids


def test_profile_files_are_consistent():
    seen_aliases: dict[str, str] = {}
    files = devices.profile_files()
    assert [f.name for f in files] == sorted(p.name for p in (Path(__file__).parents[2] / "devices").glob("*.json"))
    for f in files:
        d = json.loads(f.read_text())
        assert d["id"] == f.name.removesuffix(".json")
        p = devices.DeviceProfile.from_dict(d)
        assert p.arch in ("aarch64", "x86_64")
        assert p.providers and p.draft_providers and "cpu" in p.providers
        assert p.default_max_len >= 256
        for a in p.aliases:
            assert a not in seen_aliases, f"alias {a} used by {seen_aliases.get(a)} and {p.id}"
            seen_aliases[a] = p.id
        if p.family != "generic":
            assert p.bandwidth_gbs and p.cpu_cores and p.detect.get("model"), p.id
        if p.memory_bytes is not None and p.memory_reserve_bytes is not None:
            assert 0 < p.memory_budget_bytes < p.memory_bytes


@pytest.mark.parametrize("pid, mem_gib, bw, cores, modes", [
    ("jetson-orin-nano-8gb", 8, 68, 6, [7, 15, 25]),
    ("jetson-orin-nx-16gb", 16, 102, 8, [10, 15, 25, 40]),
    ("jetson-agx-orin-64gb", 64, 205, 12, [15, 30, 50, 60]),
    ("rpi5-8gb", 8, 17, 4, []),
])
def test_profile_facts_match_the_design_notes(pid, mem_gib, bw, cores, modes):
    p = devices.get(pid)
    assert p.memory_bytes == mem_gib * GIB
    assert p.bandwidth_gbs == bw
    assert p.cpu_cores == cores
    assert [m["watts"] for m in p.power_modes] == modes


def test_get_by_alias_and_unknown_device_lists_the_known_ones():
    assert devices.get("orin-nano").id == "jetson-orin-nano-8gb"
    assert devices.get("PI5-16GB").id == "rpi5-16gb"
    with pytest.raises(InvalidRequest) as e:
        devices.get("jetson-tx1")
    msg = str(e.value)
    assert "jetson-tx1" in msg and "jetson-orin-nano-8gb" in msg and "rpi4" in msg


@pytest.mark.parametrize("tree, pid, cores, l4t, jetpack", [
    ("jetson-orin-nano", "jetson-orin-nano-8gb", 6, "36.4.3", "6.2"),
    ("jetson-agx-orin", "jetson-agx-orin-64gb", 12, "35.4.1", "5"),
    ("rpi5", "rpi5-8gb", 4, None, None),
    ("rpi4", "rpi4", 4, None, None),
])
def test_detect_fake_boards(tree, pid, cores, l4t, jetpack):
    p = devices.detect(FAKES / tree)
    assert p.id == pid
    assert p.cpu_cores == cores
    assert p.arch == "aarch64"
    assert p.detected["tegra_release"] == l4t
    assert p.detected.get("jetpack") == jetpack
    # memory is what the kernel reports, not the nominal size
    meminfo = (FAKES / tree / "proc/meminfo").read_text().splitlines()[0]
    assert p.memory_bytes == int(meminfo.split()[1]) * 1024


def test_detect_reads_cpu_model_from_the_arm_part_number():
    assert devices.detect(FAKES / "rpi5").cpu_model == "Cortex-A76"
    assert devices.detect(FAKES / "rpi4").cpu_model == "Cortex-A72"


@pytest.mark.parametrize("kib, pid", [(4045000, "rpi5-4gb"), (8245264, "rpi5-8gb"), (16337000, "rpi5-16gb")])
def test_detect_pi5_memory_variants(tmp_path, kib, pid):
    root = copy_tree("rpi5", tmp_path)
    set_memtotal(root, kib)
    p = devices.detect(root)
    assert p.id == pid
    assert not any("nearest" in n or "no profile" in n for n in p.notes)


def test_detect_unlisted_variant_uses_nearest_profile_with_real_memory(tmp_path):
    root = copy_tree("rpi5", tmp_path)
    set_memtotal(root, 2020000)  # a Pi 5 2GB: no profile of its own
    p = devices.detect(root)
    assert p.id == "rpi5-4gb"
    assert p.memory_bytes == 2020000 * 1024
    assert any("no profile for this memory size" in n for n in p.notes)
    assert p.memory_budget_bytes == 2020000 * 1024 - int(1.25 * GIB)


def test_detect_unknown_jetson_falls_back_to_generic_with_a_note(tmp_path):
    root = copy_tree("jetson-orin-nano", tmp_path)
    (root / "proc/device-tree/model").write_bytes(b"NVIDIA Jetson Xavier NX Developer Kit\x00")
    p = devices.detect(root)
    assert p.id == "generic-aarch64"
    assert any("L4T 36.4.3" in n for n in p.notes)


def test_detect_orin_nano_4gb_uses_the_nearest_jetson_profile_with_its_real_memory(tmp_path):
    root = copy_tree("jetson-orin-nano", tmp_path)
    set_memtotal(root, 3800000)  # an Orin Nano 4GB: no profile, nearest Jetson of that family is the 8GB
    p = devices.detect(root)
    assert p.id == "jetson-orin-nano-8gb"
    assert p.memory_bytes == 3800000 * 1024
    assert any("no profile for this memory size" in n for n in p.notes)


def test_detect_x86_and_empty_trees(tmp_path):
    x86 = tmp_path / "x86"
    (x86 / "proc").mkdir(parents=True)
    (x86 / "proc/cpuinfo").write_text("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Test CPU\nflags\t: fpu sse\n\n"
                                      "processor\t: 1\nvendor_id\t: GenuineIntel\nmodel name\t: Test CPU\nflags\t: fpu sse\n")
    (x86 / "proc/meminfo").write_text("MemTotal:       16000000 kB\nMemAvailable:   12000000 kB\n")
    p = devices.detect(x86)
    assert p.id == "generic-x86_64" and p.cpu_cores == 2 and p.cpu_model == "Test CPU"
    assert p.memory_bytes == 16000000 * 1024
    assert p.memory_budget_bytes is None  # generic: no default budget
    empty = devices.detect(tmp_path / "nothing-here")  # no files at all: still a profile, never an exception
    assert empty.id.startswith("generic-")


def test_resolve():
    assert devices.resolve(None, root=FAKES / "rpi4").id == "rpi4"
    assert devices.resolve("auto", root=FAKES / "rpi5").id == "rpi5-8gb"
    assert devices.resolve("agx-orin").id == "jetson-agx-orin-64gb"
    p = devices.get("rpi4")
    assert devices.resolve(p) is p
    with pytest.raises(InvalidRequest):
        devices.resolve(42)


def test_live_detection_on_this_machine():
    p = devices.detect()
    assert p.id in devices.profiles()
    assert p.cpu_cores and p.cpu_cores >= 1
    assert p.memory_bytes and p.memory_bytes > 256 << 20


def test_engine_defaults_fill_only_what_is_unset():
    nano = devices.get("orin-nano")
    d = devices.engine_defaults(nano)
    assert d == {"providers": ["cuda", "cpu"], "draft_providers": ["cuda", "cpu"], "threads": 6}
    d = devices.engine_defaults(nano, providers="cpu", threads=2)
    assert d == {"providers": "cpu", "draft_providers": "cpu", "threads": 2}  # the draft follows an explicit target choice
    d = devices.engine_defaults(nano, draft_providers="cpu")
    assert d["providers"] == ["cuda", "cpu"] and d["draft_providers"] == "cpu"
    assert devices.engine_defaults(None, threads=3) == {"providers": None, "draft_providers": None, "threads": 3}
    assert devices.engine_defaults(devices.get("generic-x86_64"))["threads"] is None  # onnxruntime's default


def test_engine_defaults_from_a_profile_are_quiet_orders_explicit_ones_are_not():
    from edgespec.edge.providers import ProfileOrder

    d = devices.engine_defaults(devices.get("orin-nano"))
    assert isinstance(d["providers"], ProfileOrder) and isinstance(d["draft_providers"], ProfileOrder)
    d = devices.engine_defaults(devices.get("orin-nano"), providers=["cuda", "cpu"])
    assert not isinstance(d["providers"], ProfileOrder) and not isinstance(d["draft_providers"], ProfileOrder)


def test_measured_memory_for_a_profile_without_a_size_on_the_board_itself(tmp_path):
    """A Pi 4 2GB: the rpi4 profile has no memory size; on the board the kernel's number counts and
    the default budget is that less the profile's 1 GiB reserve."""
    root = copy_tree("rpi4", tmp_path)
    set_memtotal(root, 1_893_000)
    p = devices.with_measured_memory(devices.get("rpi4"), root)
    assert p.memory_bytes == 1_893_000 * 1024
    assert p.memory_budget_bytes == 1_893_000 * 1024 - GIB
    assert p.detected["memory_source"] == "measured" and p.detected["memory_measured_on"] == "this board"
    assert devices.get("rpi4").memory_bytes is None  # the stored profile is untouched


def test_measured_memory_on_another_board_says_which(tmp_path):
    root = copy_tree("jetson-orin-nano", tmp_path)
    set_memtotal(root, 7_800_000)
    p = devices.with_measured_memory(devices.get("rpi4"), root)
    assert p.memory_bytes == 7_800_000 * 1024
    assert p.detected["memory_measured_on"] == devices.detect(root).name != "this board"


def test_profile_with_a_size_keeps_it_off_the_board_and_takes_the_kernels_on_it(tmp_path):
    jetson = copy_tree("jetson-orin-nano", tmp_path)
    p = devices.with_measured_memory(devices.get("rpi5-8gb"), jetson)
    assert p.memory_bytes == 8 * GIB and p.detected["memory_source"] == "profile"
    pi5 = copy_tree("rpi5", tmp_path)
    set_memtotal(pi5, 8_000_000)  # what an "8 GB" Pi 5 reports
    assert devices.detect(pi5).id == "rpi5-8gb"
    p = devices.with_measured_memory(devices.get("rpi5-8gb"), pi5)
    assert p.memory_bytes == 8_000_000 * 1024 and p.detected["memory_measured_on"] == "this board"


def test_measured_memory_without_meminfo_is_unknown_not_invented(tmp_path):
    (tmp_path / "proc").mkdir()
    p = devices.with_measured_memory(devices.get("rpi4"), tmp_path)
    assert p.memory_bytes is None and p.memory_budget_bytes is None
    assert p.detected["memory_source"] == "unknown"


def test_detected_profile_records_its_memory_as_measured(tmp_path):
    root = copy_tree("rpi4", tmp_path)
    p = devices.detect(root)
    assert p.detected["memory_source"] == "measured"
    assert devices.with_measured_memory(p, "/").memory_bytes == p.memory_bytes  # not read again elsewhere


def test_gpu_profiles_leave_tensorrt_out_of_the_default_order():
    """TensorRT has no GroupQueryAttention or MatMulNBits: it would get only fragments of the
    graphs (docs/edge.md, "TensorRT"). It can still be asked for with --providers."""
    for pid in devices.profiles():
        p = devices.get(pid)
        assert "tensorrt" not in p.providers and "tensorrt" not in p.draft_providers, pid
        if p.family == "jetson":
            assert p.providers == ["cuda", "cpu"] and any("TensorRT" in n for n in p.notes)
