"""`edgespec doctor` on fake Jetson and Pi trees (real layout, fake vcgencmd/nvpmodel) and here."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import onnxruntime as ort
import pytest

from edgespec.cli import main as cli

from edgespec.edge import doctor
from edgespec.edge.providers import CPU, CUDA, TRT
from edgespec.models.kernels import ORT_FLOORS

FAKES = Path(__file__).parents[1] / "fakes"


@pytest.fixture
def board(tmp_path, monkeypatch):
    """Copies a fake tree and puts its fake tools first on PATH."""

    def make(name: str) -> Path:
        root = tmp_path / name
        shutil.copytree(FAKES / name, root)
        monkeypatch.setenv("PATH", os.pathsep.join([str(root / "usr/bin"), str(root / "usr/sbin"), os.environ["PATH"]]))
        return root

    return make


def test_fake_jetson(board):
    root = board("jetson-orin-nano")
    r = doctor.collect(root)
    assert r["board"]["id"] == "jetson-orin-nano-8gb"
    assert r["board"]["detected"]["tegra_release"] == "36.4.3"
    assert r["memory"]["total_bytes"] == 7620468 * 1024 and r["memory"]["shared_with_gpu"]
    prov = {p["provider"]: p for p in r["providers"]}
    assert prov["cpu"]["works"] is True
    assert prov["cuda"]["works"] is False and "tensorrt" not in prov  # not in the Jetson's order any more
    missing = {m["what"]: m for m in r["missing"]}
    assert "onnxruntime-gpu" in missing["cuda"]["how"] and "jp6" in missing["cuda"]["how"]
    assert "tensorrt" not in missing  # nothing to install for a provider the order does not use
    po = r["provider_order"]
    assert po["order"] == ["cuda", "cpu"] and "--ep cuda" in po["why"] and "TensorRT is left out" in po["why"]
    assert "GroupQueryAttention or MatMulNBits" in doctor.render(r)
    assert r["sensors"]["total_rail"] == "VDD_IN"
    assert r["sensors"]["reading"]["power_w"] == pytest.approx(5.226, abs=1e-3)
    assert r["sensors"]["reading"]["temp_c"] == pytest.approx(47.281)
    assert r["power_mode"] == {"name": "15W", "id": 0}
    rec = r["recommended"]
    assert rec["providers"] == "cpu" and rec["threads"] == 6 and rec["memory_budget"] == "4.75GiB"
    text = doctor.render(r)
    for want in ("Jetson Orin Nano 8GB", "L4T 36.4.3 (JetPack 6.2: Ubuntu 22.04, Python 3.10, CUDA 12.6)", "cpu       works", "missing: not in this onnxruntime build",
                 "power 5.23 W", "15W (nvpmodel mode 0)", "--providers cpu", f"how: pip download --no-deps -d /tmp/ort-gpu 'onnxruntime-gpu>={ORT_FLOORS['cuda']}' --index-url"):
        assert want in text, want


def test_fake_jetson_with_a_gpu_build_whose_cuda_fails(board, monkeypatch):
    root = board("jetson-orin-nano")
    real = ort.InferenceSession

    def session(model, so=None, providers=None, **kw):
        name = providers[0][0] if isinstance(providers[0], tuple) else providers[0]
        if name != CPU:
            raise RuntimeError("libcublasLt.so.12: cannot open shared object file")
        return real(model, so, providers=providers)

    monkeypatch.setattr(ort, "get_available_providers", lambda: [TRT, CUDA, CPU])
    monkeypatch.setattr(ort, "InferenceSession", session)
    r = doctor.collect(root)
    prov = {p["provider"]: p for p in r["providers"]}
    assert prov["cuda"]["in_build"] and not prov["cuda"]["works"] and "libcublasLt" in prov["cuda"]["error"]
    missing = {m["what"]: m for m in r["missing"]}
    assert "failed" in missing["cuda"]["why"]
    assert "FAILED: libcublasLt" in doctor.render(r)


def test_fake_pi5(board):
    root = board("rpi5")
    r = doctor.collect(root)
    assert r["board"]["id"] == "rpi5-8gb"
    assert [p["provider"] for p in r["providers"]] == ["cpu"]
    assert r["missing"] == []  # no GPU to nag about
    assert r["sensors"]["reading"]["power_w"] > 3.0
    assert r["throttling"] == {"known": True, "bits": "0x0", "now": [], "since_boot": []}
    assert r["recommended"]["max_temp"] == "80C" and r["recommended"]["threads"] == 4
    (root / "usr/share/fake-tools/get_throttled").write_text("throttled=0x50005\n")
    r = doctor.collect(root)
    assert r["throttling"]["now"] == ["under-voltage", "throttled"]
    assert "now: under-voltage, throttled" in doctor.render(r)


def test_fake_pi4_has_no_power_reading(board):
    root = board("rpi4")
    r = doctor.collect(root, probe=False)
    assert r["board"]["id"] == "rpi4"
    assert r["sensors"]["reading"]["power_w"] is None
    assert "power: no sensor" in doctor.render(r)
    assert r["providers"][0]["works"] is None  # not probed


def test_cli_json_on_fake_tree(board, capsys):
    root = board("jetson-agx-orin")
    rc = cli.main(["doctor", "--json", "--root", str(root)])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert out["board"]["id"] == "jetson-agx-orin-64gb" and out["board"]["detected"]["jetpack"] == "5"
    assert out["sensors"]["total_rail"] is None and out["sensors"]["reading"]["power_w"] > 10


def test_cli_text_here(capsys):
    rc = cli.main(["doctor"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "board" in out and "cpu       works" in out and "recommended" in out


def test_cli_device_override(capsys):
    rc = cli.main(["doctor", "--device", "rpi5-16gb", "--no-probe", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["board"]["id"] == "rpi5-16gb"


def test_cli_unknown_device_is_one_clear_line(capsys):
    rc = cli.main(["doctor", "--device", "pi7"])
    err = capsys.readouterr().err
    assert rc == 1 and "unknown device 'pi7'" in err and err.count("\n") == 1


def test_exit_1_when_not_even_cpu_works(monkeypatch, capsys):
    monkeypatch.setattr(ort, "InferenceSession", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("broken install")))
    rc = cli.main(["doctor"])
    out = capsys.readouterr().out
    assert rc == 1 and "FAILED: broken install" in out and "force-reinstall onnxruntime" in out


def test_named_pi4_on_the_board_gets_its_budget_from_the_measured_memory(board, capsys):
    """The rpi4 profile has no memory size (1-8 GB boards): on the board, MemTotal decides."""
    root = board("rpi4")
    r = doctor.collect(root, device="rpi4", probe=False)
    mem_total = r["memory"]["total_bytes"]
    assert r["memory"]["source"] == "measured" and r["memory"]["profile_bytes"] == mem_total
    assert r["memory"]["default_budget_bytes"] == mem_total - (1 << 30)
    assert r["board"]["detected"]["how"] == "--device rpi4"
    assert "--memory-budget" in doctor.render(r)
    text = doctor.render(r)
    assert "default budget" in text and "from the measured memory" in text


def test_named_pi4_elsewhere_says_the_number_is_this_machines(board):
    root = board("jetson-orin-nano")
    text = doctor.render(doctor.collect(root, device="rpi4", probe=False))
    assert "from this machine's memory: the rpi4 profile has no size of its own" in text


def test_fake_pi5_names_the_pmic_sum_core_rails(board):
    r = doctor.collect(board("rpi5"))
    text = doctor.render(r)
    assert "core rails" in text and "board power" not in text


def test_a_suggested_budget_says_it_is_not_a_default():
    """A generic board's profile sets no budget: doctor suggests one from the memory free now and says
    that it is a suggestion to pass, not something set (before: a recommended budget, then 'none is set')."""
    r = doctor.collect("/", device="generic-x86_64", probe=False)
    rec = r["recommended"]
    assert rec["memory_budget_from"] == "available" and r["memory"]["default_budget_bytes"] is None
    text = doctor.render(r)
    assert f"--memory-budget {rec['memory_budget']}: 80 % of the " in text
    assert "the generic-x86_64 profile has no budget of its own, so pass it (it is not applied by default)" in text


def test_a_profile_budget_is_recommended_without_the_caveat(board):
    r = doctor.collect(board("jetson-orin-nano"), probe=False)
    assert r["recommended"]["memory_budget_from"] == "profile"
    assert "not applied by default" not in doctor.render(r)
