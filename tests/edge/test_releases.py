"""The release table (devices/_releases.json, edgespec/edge/releases.py) and every doc table that repeats it: the
docs' tables are rendered here from the data and must appear in the docs verbatim, so a changed row fails until the
page says the same (docs/jetson.md: JetPack releases, power modes; docs/raspberry-pi.md: OS releases and swap;
docs/edge.md: one row per board profile in devices/)."""
from __future__ import annotations

from pathlib import Path

import pytest

from edgespec.edge import devices, releases
from edgespec.models.kernels import ORT_FLOORS

DOCS = Path(__file__).parents[2] / "docs"
# how each onnxruntime source reads in a table (the long reason is the table's "what", which doctor prints)
SOURCE_LABELS = {
    "jp6-cu126": "NVIDIA's index `jp6/cu126` (`setup-env.sh` fetches it)",
    "upgrade": "none at edgespec's floor (built for CUDA 12.6): upgrade; the CPU meanwhile",
    "none": "none checked: PyPI's aarch64 wheels have no sm_87 (Orin) or sm_110 (Thor) kernels; the CPU meanwhile",
    "unsupported": "not supported (Python older than 3.10)",
}


def jetpack_table() -> str:
    rows = ["| JetPack | L4T | Ubuntu | Python | CUDA | boards | onnxruntime-gpu for edgespec |", "|---|---|---|---|---|---|---|"]
    for r in releases.table()["jetpack"]:
        l4t = f"r{r['l4t']}" + (".x" if r["l4t"].count(".") == 0 else "")
        rows.append(f"| {r['jetpack']} | {l4t} | {r['ubuntu']} | {r['python']} | {r['cuda']} | {r['boards']} | "
                    f"{SOURCE_LABELS[r['onnxruntime']]} |")
    return "\n".join(rows)


def power_mode_table() -> str:
    rows = ["| board | set | nvpmodel modes (`sudo nvpmodel -m ID`) | fastest |", "|---|---|---|---|"]
    for p in devices.profiles().values():
        for name, modes in p.power_modes.items():
            best = __import__("edgespec.edge.boardstate", fromlist=["fastest"]).fastest(modes)
            rows.append(f"| `{p.id}` | {name} | " + ", ".join(f"{m['id']} = {m['name']}" for m in modes)
                        + f" | `-m {best['id']}` ({best['name']}) |")
    return "\n".join(rows)


def pi_os_table() -> str:
    rows = ["| Raspberry Pi OS | Debian | Python | glibc | swap is set up by | swap that survives a reboot |",
            "|---|---|---|---|---|---|"]
    for r in releases.table()["raspberry_pi_os"]:
        rows.append(f"| {r['codename'].title()} | {r['debian']} | {r['python']} | {r['glibc']} | {r['swap']} | "
                    f"`{r['swap_persist']}` |")
    return "\n".join(rows)


def profiles_table() -> str:
    rows = ["| id (aliases) | memory | bandwidth | CPU | providers (target / draft) | default max_len | default memory budget |",
            "|---|---|---|---|---|---|---|"]
    gib = 1 << 30
    for p in devices.profiles().values():
        aliases = f" ({', '.join(f'`{a}`' for a in p.aliases)})" if p.aliases else ""
        memory = (f"{p.memory_bytes // gib} GB" + (" shared" if p.memory_shared_with_gpu else "")) if p.memory_bytes \
            else "read from the board"
        cpu = f"{p.cpu_cores}x {p.cpu_model}" if p.cpu_cores else "read"
        reserve = f"memory - {p.memory_reserve_bytes / gib:g} GiB" if p.memory_reserve_bytes is not None else "none"
        rows.append(f"| `{p.id}`{aliases} | {memory} | {f'{p.bandwidth_gbs:g} GB/s' if p.bandwidth_gbs else '-'} | "
                    f"{cpu} | {','.join(p.providers)} / {','.join(p.draft_providers)} | {p.default_max_len} | {reserve} |")
    return "\n".join(rows)


@pytest.mark.parametrize("doc, table", [
    ("jetson.md", jetpack_table), ("jetson.md", power_mode_table), ("raspberry-pi.md", pi_os_table),
    ("edge.md", profiles_table),
])
def test_the_docs_tables_are_the_data(doc, table):
    text = (DOCS / doc).read_text()
    want = table()
    assert want in text, f"docs/{doc} lacks this table (the data's, rendered by {table.__name__}):\n{want}"


def test_every_row_is_consistent_with_the_rest_of_the_project():
    t = releases.table()
    assert set(SOURCE_LABELS) == set(t["onnxruntime"])
    assert t["onnxruntime"]["jp6-cu126"]["requirement"] == f"onnxruntime-gpu>={ORT_FLOORS['cuda']}"
    for r in t["jetpack"]:
        assert r["onnxruntime"] in t["onnxruntime"] and set(r["power_modes"]) <= set(t["power_mode_sets"]), r
        assert (r["onnxruntime"] == "unsupported") == (tuple(map(int, r["python"].split("."))) < (3, 10)), r
    for p in devices.profiles().values():  # a profile's mode sets are the table's, and ids are unique in each
        assert set(p.power_modes) <= set(t["power_mode_sets"]), p.id
        for modes in p.power_modes.values():
            assert len({m["id"] for m in modes}) == len(modes), p.id


@pytest.mark.parametrize("l4t, name, source", [
    ("36.3", "JetPack 6.0", "upgrade"), ("36.4.0", "JetPack 6.1", "jp6-cu126"), ("36.4.3", "JetPack 6.2", "jp6-cu126"),
    ("36.4.4", "JetPack 6.2.1", "jp6-cu126"), ("36.4.7", "JetPack 6.2.1 or later", "jp6-cu126"),
    ("36.5.0", "JetPack 6.2.2", "jp6-cu126"), ("36.6", "JetPack 6.2.2 or later", "jp6-cu126"),
    ("38.2", "JetPack 7.0", "none"), ("39.2", "JetPack 7.2", "none"), ("35.6.1", "JetPack 5", "unsupported"),
    ("36.2", None, "none"), ("41.0", None, "none"), ("", None, "none"),
])
def test_an_l4t_release_reads_as_its_row_or_the_newest_row_before_it(l4t, name, source):
    assert releases.jetpack_name(l4t) == name
    assert releases.onnxruntime_source(l4t)[0] == source
