"""`edgespec doctor` on the boards as they ship: fake trees (copies of tests/fakes/ with the release files, swap,
cpufreq, nvpmodel and desktop processes of each) for JetPack 6.0 (r36.3), 6.2.1 (r36.4.4), 6.2.2 (r36.5.0), 7.2 on
Orin (r39.2), and a Pi 5 on Bookworm and on Trixie. Each names its release, the power modes with their IDs, swap
and how to make it persistent, and the onnxruntime install line, all from devices/_releases.json."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from edgespec.edge import boardstate, doctor, releases

FAKES = Path(__file__).parents[1] / "fakes"
SUPER_CONF = """# excerpt of an Orin Nano Super's /etc/nvpmodel.conf
< POWER_MODEL ID=0 NAME=15W >
CPU_ONLINE CORE_0 1
< POWER_MODEL ID=1 NAME=25W >
CPU_ONLINE CORE_0 1
< POWER_MODEL ID=2 NAME=MAXN_SUPER >
CPU_ONLINE CORE_0 1
< POWER_MODEL ID=3 NAME=7W >
CPU_ONLINE CORE_0 1
< PM_CONFIG DEFAULT=2 >
"""


def _write(root: Path, rel: str, text: str) -> None:
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_text(text)


def _common(root: Path, *, swaps: list[tuple[str, str, int, int]], governor: str, cores: int,
            desktop: dict[int, tuple[str, int]]) -> None:
    _write(root, "proc/swaps", "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"
           + "".join(f"{n}\t{t}\t{size}\t{used}\t5\n" for n, t, size, used in swaps))
    for n, _, size, _ in swaps:
        if "/zram" in n:
            _write(root, f"sys/block/{n.rsplit('/', 1)[1]}/disksize", str(size * 1024))
    for c in range(cores):
        _write(root, f"sys/devices/system/cpu/cpu{c}/cpufreq/scaling_governor", governor + "\n")
    for pid, (name, rss_kib) in desktop.items():
        _write(root, f"proc/{pid}/comm", name + "\n")
        _write(root, f"proc/{pid}/status", f"Name:\t{name}\nVmRSS:\t  {rss_kib} kB\n")
    _write(root, "proc/77/comm", "sshd\n")  # not a desktop


def jetson(tmp_path: Path, revision: str, major: int = 36, *, conf: str | None = None, status: str | None = None,
           desktop: dict[int, tuple[str, int]] | None = None) -> Path:
    root = tmp_path / f"jetson-r{major}.{revision}"
    shutil.copytree(FAKES / "jetson-orin-nano", root)
    _write(root, "etc/nv_tegra_release", f"# R{major} (release), REVISION: {revision}, GCID: 1, BOARD: generic, "
           "EABI: aarch64, DATE: Mon Jan 1 00:00:00 UTC 2026\n")
    if conf:
        _write(root, "etc/nvpmodel.conf", conf)
    if status:
        _write(root, boardstate.NVPMODEL_STATUS, status)
    _common(root, swaps=[(f"/dev/zram{i}", "partition", 635000, 0) for i in range(6)], governor="schedutil",
            cores=6, desktop=desktop or {})
    return root


def pi5(tmp_path: Path, codename: str) -> Path:
    root = tmp_path / f"pi5-{codename}"
    shutil.copytree(FAKES / "rpi5", root)
    debian = {"bookworm": "12", "trixie": "13"}[codename]
    _write(root, "etc/os-release", f'PRETTY_NAME="Debian GNU/Linux {debian} ({codename})"\nID=debian\n'
           f"VERSION_ID=\"{debian}\"\nVERSION_CODENAME={codename}\n")
    swaps = [("/var/swap", "file", 524284, 1024)] if codename == "bookworm" else [("/dev/zram0", "partition", 2097148, 0)]
    _common(root, swaps=swaps, governor="ondemand", cores=4,
            desktop={812: ("labwc", 61440), 840: ("wf-panel-pi", 30000)} if codename == "trixie" else {})
    return root


def _doctor(root: Path) -> tuple[dict, str]:
    r = doctor.collect(root, probe=False, path=str(root / "no-tools"))  # no nvpmodel: files only
    return r, doctor.render(r)


def test_jetpack_6_0_r36_3_is_told_to_upgrade_and_runs_on_the_cpu_meanwhile(tmp_path):
    r, text = _doctor(jetson(tmp_path, "3.0"))
    assert "L4T 36.3.0 (JetPack 6.0: Ubuntu 22.04, Python 3.10, CUDA 12.2)" in text
    assert r["install"].startswith("pip install 'edgespec[cpu]'   (JetPack 6.0, L4T 36.3.0: no onnxruntime-gpu at "
                                   "edgespec's floor for CUDA 12.2")
    assert list(r["power_modes"]["sets"]) == ["standard"]  # no Super modes before JetPack 6.2
    assert "modes        standard: 0 = 15W, 1 = 7W\n               fastest: sudo nvpmodel -m 0 (15W)" in text


def test_jetpack_6_2_1_r36_4_4_gets_nvidias_wheel_and_both_mode_sets_with_the_super_caveat(tmp_path):
    r, text = _doctor(jetson(tmp_path, "4.4"))
    src = releases.table()["onnxruntime"]["jp6-cu126"]
    assert "L4T 36.4.4 (JetPack 6.2.1: " in text
    assert r["install"] == releases.gpu_install_line(src) + "   (JetPack 6.2.1, L4T 36.4.4; docs/jetson.md)"
    assert f"--index-url {src['index']}" in r["install"] and "jp6/cu126" in src["index"]
    assert "super: 0 = 15W, 1 = 25W, 2 = MAXN_SUPER, 3 = 7W" in text
    assert "fastest: sudo nvpmodel -m 2 (MAXN_SUPER); the Super modes (JetPack 6.2 on, Orin Nano and NX) need the " \
           "Super flash config" in text
    assert "(from the jetson-orin-nano-8gb profile for JetPack 6.2.1)" in text


def test_jetpack_6_2_2_r36_5_0_reads_the_boards_own_modes_and_the_mode_it_booted_in(tmp_path):
    root = jetson(tmp_path, "5.0", conf=SUPER_CONF, status="pmode:0002 fmode:quiet\n",
                  desktop={901: ("gdm3", 10240), 955: ("Xorg", 81920), 960: ("gnome-shell", 262144)})
    r, text = _doctor(root)
    assert "L4T 36.5.0 (JetPack 6.2.2: Ubuntu 22.04, Python 3.10, CUDA 12.6)" in text
    assert r["power_mode"] == {"name": "MAXN_SUPER", "id": 2, "from": boardstate.NVPMODEL_STATUS}
    assert "power mode   MAXN_SUPER (nvpmodel mode 2)" in text
    assert r["power_modes"]["source"] == "/etc/nvpmodel.conf" and r["power_modes"]["default"] == 2
    assert "this board: 0 = 15W, 1 = 25W, 2 = MAXN_SUPER, 3 = 7W\n               fastest: sudo nvpmodel -m 2 " \
           "(MAXN_SUPER)\n             (from /etc/nvpmodel.conf)" in text
    assert "index-url https://pypi.jetson-ai-lab.io/jp6/cu126" in r["install"] and "JetPack 6.2.2" in r["install"]
    # swap: JetPack's zram, and the fstab line that makes a swap file survive a reboot
    assert [s["name"] for s in r["system"]["swap"]] == [f"/dev/zram{i}" for i in range(6)]
    assert "swap         /dev/zram0 620 MiB (zram)," in text and "set up by zram (nvzramconfig)" in text
    assert "echo '/swapfile none swap sw 0 0' | sudo tee -a /etc/fstab" in text
    assert "zram off: sudo systemctl disable --now nvzramconfig" in text
    assert "governor     schedutil (6 cores)\n             steadier step times: echo performance | sudo tee " in text
    assert r["system"]["desktop_rss_bytes"] == (10240 + 81920 + 262144) * 1024
    assert "desktop      gdm3, Xorg, gnome-shell running: 346 MiB resident\n             for a service: sudo " \
           "systemctl set-default multi-user.target" in text


def test_a_later_r36_release_is_read_as_jetpack_6_2_2_or_later(tmp_path):
    r, text = _doctor(jetson(tmp_path, "6.0"))
    assert "L4T 36.6.0 (JetPack 6.2.2 or later: " in text and "jp6/cu126" in r["install"]


def test_jetpack_7_2_r39_2_on_orin_says_why_no_gpu_wheel_is_installed(tmp_path):
    r, text = _doctor(jetson(tmp_path, "2", major=39))
    assert "L4T 39.2 (JetPack 7.2: Ubuntu 24.04, Python 3.12, CUDA 13.2)" in text
    assert r["install"].startswith("pip install 'edgespec[cpu]'   (JetPack 7.2, L4T 39.2: no onnxruntime-gpu checked "
                                   "for this release: PyPI's aarch64 onnxruntime-gpu")
    assert "not Orin's sm_87" in r["install"]
    assert list(r["power_modes"]["sets"]) == ["standard", "super"]


@pytest.mark.parametrize("codename, python, setup, persist", [
    ("bookworm", "3.11", "dphys-swapfile", "CONF_SWAPSIZE=2048/' /etc/dphys-swapfile"),
    ("trixie", "3.13", "rpi-swap (zram by default; /etc/rpi/swap.conf", "sudoedit /etc/rpi/swap.conf && sudo reboot"),
])
def test_pi5_names_its_os_release_swap_and_install_line(tmp_path, codename, python, setup, persist):
    r, text = _doctor(pi5(tmp_path, codename))
    assert r["board"]["id"] == "rpi5-8gb" and "power_modes" not in r and "modes   " not in text
    assert f"os           Debian GNU/Linux {'12' if codename == 'bookworm' else '13'} ({codename}) (Python {python}, " \
           f"glibc {releases.pi_os(codename)['glibc']})" in text
    assert f"set up by {setup}" in text and persist in text
    assert r["install"] == "pip install 'edgespec[cpu]'" and "install      onnxruntime for this board: pip install " \
           "'edgespec[cpu]'" in text
    assert "governor     ondemand (4 cores)" in text
    assert "missing " not in text  # not probed (--no-probe) is not broken
    if codename == "bookworm":
        assert "swap         /var/swap 512 MiB, 1 MiB used;" in text and "desktop      none running" in text
    else:
        assert "swap         /dev/zram0 2 GiB (zram);" in text
        assert "desktop      labwc running: 60 MiB resident" in text  # wf-panel-pi is not in the list


def test_nvpmodel_conf_and_status_parse_what_the_board_writes(tmp_path):
    _write(tmp_path, "etc/nvpmodel.conf", SUPER_CONF)
    assert boardstate.nvpmodel_conf(tmp_path) == {"default": 2, "modes": [
        {"id": 0, "name": "15W", "watts": 15}, {"id": 1, "name": "25W", "watts": 25},
        {"id": 2, "name": "MAXN_SUPER", "watts": None}, {"id": 3, "name": "7W", "watts": 7}]}
    assert boardstate.nvpmodel_status(tmp_path) is None
    _write(tmp_path, boardstate.NVPMODEL_STATUS, "pmode:0003 fmode:cool\n")
    assert boardstate.nvpmodel_status(tmp_path) == 3
    assert boardstate.fastest([{"id": 1, "name": "10W", "watts": 10}, {"id": 3, "name": "25W", "watts": 25}])["id"] == 3
    assert boardstate.fastest([]) is None
