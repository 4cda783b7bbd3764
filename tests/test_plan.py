"""`edgespec plan BUNDLE --device D --memory-budget SIZE`."""
from __future__ import annotations

import json
import os

import pytest

from edgespec import cli, memory


def test_plan_prints_the_numbers(tiny_bundle, capsys):
    rc = cli.main(["plan", str(tiny_bundle), "--device", "jetson-orin-nano-8gb", "--memory-budget", "5GiB"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "NVIDIA Jetson Orin Nano 8GB" in out
    p = memory.plan(tiny_bundle, max_len=None, want_draft=True, budget_bytes=5 << 30)
    assert f"max_len {p.max_len}, draft model loaded" in out
    assert memory.format_size(p.predicted_bytes) in out and "of budget 5 GiB" in out
    for part in ("target_weights", "target_kv", "draft_weights", "draft_kv", "working", "runtime"):
        assert part in out


def test_plan_json_and_retreat(tiny_bundle, capsys):
    floor_with = memory.plan(tiny_bundle, max_len=memory.MIN_MAX_LEN, want_draft=True, budget_bytes=None)
    rc = cli.main(["plan", str(tiny_bundle), "--memory-budget", str(floor_with.predicted_bytes - 1), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert out["load_draft"] is False and out["predicted_bytes"] <= out["budget_bytes"]
    assert any("draft model dropped" in n for n in out["notes"])


def test_plan_refuses_with_numbers_not_an_oom(tiny_bundle, capsys):
    rc = cli.main(["plan", str(tiny_bundle), "--memory-budget", "20MiB"])
    err = capsys.readouterr().err
    assert rc == 1
    assert err.startswith("edgespec plan: error: memory budget 20 MiB is too small")
    assert "needs" in err and "target weights" in err


@pytest.mark.parametrize("args, words", [
    (["--memory-budget", "lots"], "not a memory size: 'lots'"),
    (["--device", "nano9000"], "unknown device 'nano9000'"),
])
def test_plan_bad_input_is_one_clear_line(tiny_bundle, capsys, args, words):
    rc = cli.main(["plan", str(tiny_bundle), *args])
    err = capsys.readouterr().err
    assert rc == 1 and words in err


def test_plan_missing_bundle(tmp_path, capsys):
    rc = cli.main(["plan", str(tmp_path / "nope")])
    assert rc == 1 and "does not exist" in capsys.readouterr().err


@pytest.mark.skipif(bool(os.environ.get("EDGESPEC_ARM64")),
                    reason="under qemu user-mode emulation RSS includes the emulator's translation cache")
def test_plan_measure_compares_with_a_fresh_process(tiny_bundle, capsys):
    rc = cli.main(["plan", str(tiny_bundle), "--max-len", "256", "--measure", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert out["measured_peak_bytes"] > 30 << 20
    assert abs(out["error"]) < 0.2


def test_plan_on_a_detected_fake_pi5_uses_its_real_memory(tiny_bundle, tmp_path, capsys):
    import shutil
    from pathlib import Path

    root = tmp_path / "pi5"
    shutil.copytree(Path(__file__).parent / "fakes" / "rpi5", root)
    meminfo = root / "proc/meminfo"
    # a Pi 5 4GB with almost nothing available right now
    meminfo.write_text("MemTotal:        4045000 kB\nMemAvailable:      20000 kB\n")
    rc = cli.main(["plan", str(tiny_bundle), "--root", str(root), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert out["device"] == "rpi5-4gb"
    assert out["budget_bytes"] == 4045000 * 1024 - int(1.25 * (1 << 30))  # MemTotal less the profile's reserve
    assert "MemAvailable" in out["warning"]  # the plan needs more than is free right now
