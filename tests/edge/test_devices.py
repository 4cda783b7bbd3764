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
            "rpi5-16gb", "rpi4", "generic-x86_64", "generic-aarch64", "jetson-orin-nano-4gb", "jetson-orin-nx-8gb",
            "jetson-agx-orin-32gb", "rpi5-1gb", "rpi5-2gb", "rpi-cm5", "rpi500"} <= ids


def test_profile_files_are_consistent():
    seen_aliases: dict[str, str] = {}
    files = devices.profile_files()
    assert [f.name for f in files] == sorted(p.name for p in (Path(__file__).parents[2] / "devices").glob("*.json")
                                             if not p.name.startswith("_"))  # _releases.json: the release table
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
    # nvpmodel id = name per set (NVIDIA's power-mode tables; the Super set from JetPack 6.2 on)
    ("jetson-orin-nano-8gb", 8, 68, 6, {"standard": "0=15W 1=7W", "super": "0=15W 1=25W 2=MAXN_SUPER 3=7W"}),
    ("jetson-orin-nx-16gb", 16, 102, 8, {"standard": "0=MAXN 1=10W 2=15W 3=25W",
                                         "super": "0=MAXN_SUPER 1=10W 2=15W 3=25W 4=40W"}),
    ("jetson-agx-orin-64gb", 64, 205, 12, {"standard": "0=MAXN 1=15W 2=30W 3=50W"}),
    ("rpi5-8gb", 8, 17, 4, {}),
])
def test_profile_facts_match_the_design_notes(pid, mem_gib, bw, cores, modes):
    p = devices.get(pid)
    assert p.memory_bytes == mem_gib * GIB
    assert p.bandwidth_gbs == bw
    assert p.cpu_cores == cores
    assert {k: " ".join(f"{m['id']}={m['name']}" for m in ms) for k, ms in p.power_modes.items()} == modes
    for ms in p.power_modes.values():  # a name in watts says its watts; MAXN is uncapped
        assert all(m["watts"] == (int(m["name"][:-1]) if m["name"].endswith("W") else None) for m in ms), ms


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


def test_detect_unlisted_variant_uses_nearest_profile_with_real_memory_and_warns(tmp_path, caplog):
    root = copy_tree("rpi5", tmp_path)
    set_memtotal(root, 20 * 1024 * 1024)  # a 20 GiB Pi 5: no such board, nearest is the 16GB
    devices._warned.clear()
    with caplog.at_level("WARNING", logger="edgespec.edge.devices"):
        p = devices.detect(root)
    assert p.id == "rpi5-16gb"
    assert p.memory_bytes == 20 * GIB
    assert any("no profile for this memory size" in n for n in p.notes)
    assert p.memory_budget_bytes == 20 * GIB - 2 * GIB
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and warned[0].startswith("board guessed: 'Raspberry Pi 5 Model B Rev 1.0' with 20.0 GiB")


@pytest.mark.parametrize("tree, model, kib, online, pid, bandwidth, threads", [
    ("rpi5", None, 2020000, None, "rpi5-2gb", 17, 4),  # a Pi 5 2GB
    ("rpi5", None, 990000, None, "rpi5-1gb", 17, 4),
    ("rpi5", "Raspberry Pi 500 Rev 1.0", 8245264, None, "rpi500", 17, 4),  # "Raspberry Pi 5" is in its name
    ("rpi5", "Raspberry Pi Compute Module 5 Rev 1.0", 4045000, None, "rpi-cm5", 17, 4),
    ("jetson-orin-nano", None, 3800000, None, "jetson-orin-nano-4gb", 34, 6),  # not the 8GB's 68 GB/s
    ("jetson-orin-nano", "NVIDIA Jetson Orin NX Engineering Reference Developer Kit", 7620468, "0-5",
     "jetson-orin-nx-8gb", 102, 6),  # 6 cores, not the 16GB's 8
    ("jetson-agx-orin", "Jetson AGX Orin", 31000000, "0-7", "jetson-agx-orin-32gb", 205, 8),  # not the 64GB's 12
    ("jetson-orin-nano", None, 7620468, "0-3", "jetson-orin-nano-8gb", 68, 4),  # a low nvpmodel mode: 2 cores off
    ("jetson-agx-orin", None, 64000000, "0-3,8-11", "jetson-agx-orin-64gb", 205, 8),
])
def test_variants_get_their_own_profile_and_threads_never_exceed_the_cores_online(tmp_path, caplog, tree, model, kib,
                                                                                  online, pid, bandwidth, threads):
    root = copy_tree(tree, tmp_path)
    set_memtotal(root, kib)
    if model:
        (root / "proc/device-tree/model").write_bytes(model.encode() + b"\x00")
    if online:
        (root / "sys/devices/system/cpu").mkdir(parents=True, exist_ok=True)
        (root / "sys/devices/system/cpu/online").write_text(online + "\n")
    devices._warned.clear()
    with caplog.at_level("WARNING", logger="edgespec.edge.devices"):
        p = devices.detect(root)
    assert (p.id, p.bandwidth_gbs, p.default_threads) == (pid, bandwidth, threads)
    assert not [r for r in caplog.records if "guessed" in r.getMessage()]  # an exact match is not a guess
    if online:
        assert p.cpu_cores == devices._cpu_list_count(online) and p.detected["cpu_online"] == p.cpu_cores
    clamped = [n for n in p.notes if "clamped" in n]
    assert bool(clamped) == (pid in ("jetson-orin-nano-8gb", "jetson-agx-orin-64gb"))


@pytest.mark.parametrize("text, n", [("0-3\n", 4), ("0-1,4-5", 4), ("0", 1), ("0-3,6", 5), ("", None), ("x-3", None)])
def test_the_kernels_cpu_list_format(text, n):
    assert devices._cpu_list_count(text) == n


def test_a_named_profile_and_engine_defaults_clamp_threads_to_the_cores_online(tmp_path):
    root = tmp_path / "box"
    (root / "sys/devices/system/cpu").mkdir(parents=True)
    (root / "sys/devices/system/cpu/online").write_text("0-1\n")
    assert devices.with_measured_memory(devices.get("agx-orin"), root).default_threads == 2
    assert devices.engine_defaults(devices.get("agx-orin"), online=3)["threads"] == 3
    assert devices.engine_defaults(devices.get("agx-orin"), threads=16, online=3)["threads"] == 16  # the user's own
    assert devices.engine_defaults(devices.get("agx-orin"), online=None)["threads"] == 12


def test_a_guessed_jetson_says_so_once(tmp_path, caplog):
    root = copy_tree("jetson-orin-nano", tmp_path)
    (root / "proc/device-tree/model").write_bytes(b"NVIDIA Jetson Xavier NX Developer Kit\x00")
    devices._warned.clear()
    with caplog.at_level("WARNING", logger="edgespec.edge.devices"):
        devices.detect(root)
        devices.detect(root)
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == 1 and msgs[0].startswith("board guessed: a Jetson (L4T 36.4.3)") and "--device" in msgs[0]


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
