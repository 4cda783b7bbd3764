"""`edgespec plan BUNDLE --device D --memory-budget SIZE`."""
from __future__ import annotations

import json
import os

import pytest

from edgespec.cli import main as cli

from edgespec import units
from edgespec import limits
from edgespec.edge import memcheck, memory
from edgespec.models.bundle import Bundle


def test_plan_prints_the_numbers(tiny_bundle, capsys):
    rc = cli.main(["plan", str(tiny_bundle), "--device", "jetson-orin-nano-8gb", "--memory-budget", "5GiB"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "NVIDIA Jetson Orin Nano 8GB" in out
    p = memory.plan(tiny_bundle, max_len=None, want_draft=True, budget_bytes=5 << 30)
    assert f"max_len {p.max_len}, draft model loaded" in out
    assert units.format_size(p.predicted_bytes) in out and "of budget 5 GiB" in out
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
def test_plan_measure_compares_with_a_fresh_process(tiny_bundle, capsys, monkeypatch):
    """--measure hands the plan's max_len and draft choice to a fresh process (measure_fresh) and
    reports (measured - predicted) / measured: positive = the plan was under."""
    calls = []

    def fake_fresh(root, *, max_len, load_draft, **kw):
        calls.append((root, max_len, load_draft))
        return {"peak": 2 * predicted[0], "baseline": 1, "after_load": 2, "pid": -1,
                "device_note": "no CUDA runtime (libcudart) on this machine: device memory cannot be measured here"}

    p = memory.plan(tiny_bundle, max_len=256, want_draft=True, budget_bytes=None)
    # a fresh engine's suffix index holds nothing and its grammar view is not built: the comparison
    # leaves the plan's full index and the view out
    assert p.breakdown["suffix_index"] == (limits.SUFFIX_CAPACITY + 1) * limits.SUFFIX_BYTES_PER_TOKEN
    vocab = Bundle.open(tiny_bundle).target.vocab_size
    assert p.breakdown["grammar"] == memory.GRAMMAR_BASE + memory.GRAMMAR_BYTES_PER_TOKEN * vocab
    predicted = [p.predicted_bytes - p.breakdown["suffix_index"] - p.breakdown["grammar"]]
    from edgespec.engine import measure

    monkeypatch.setattr(measure, "measure_fresh", fake_fresh)
    rc = cli.main(["plan", str(tiny_bundle), "--max-len", "256", "--measure", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and calls == [(tiny_bundle, 256, True)]
    assert out["measured_peak_bytes"] == 2 * predicted[0] and out["error"] == 0.5
    assert out["device_measured_bytes"] is None and "cannot be measured" in out["device_note"]
    rc = cli.main(["plan", str(tiny_bundle), "--max-len", "256", "--measure"])
    text = capsys.readouterr().out
    assert "(+50.0 %)" in text and "device memory: no CUDA runtime" in text


def test_plan_shows_the_device_side_of_a_cuda_flavored_bundle(tiny_cuda_bundle, capsys):
    rc = cli.main(["plan", str(tiny_cuda_bundle), "--max-len", "256", "--device", "jetson-orin-nano-8gb", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    dev = out["device_plan"]
    assert dev["predicted_bytes"] == sum(dev["breakdown"].values())
    assert dev["breakdown"]["target_kv"] > 0 and "cuda_context" in dev["estimated"]


def test_plan_on_a_detected_fake_pi5_uses_its_real_memory(tiny_bundle, tmp_path, capsys):
    import shutil
    from pathlib import Path

    root = tmp_path / "pi5"
    shutil.copytree(Path(__file__).parents[1] / "fakes" / "rpi5", root)
    meminfo = root / "proc/meminfo"
    # a Pi 5 4GB with almost nothing available right now
    meminfo.write_text("MemTotal:        4045000 kB\nMemAvailable:      20000 kB\n")
    rc = cli.main(["plan", str(tiny_bundle), "--root", str(root), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert out["device"] == "rpi5-4gb"
    assert out["budget_bytes"] == 4045000 * 1024 - int(1.25 * (1 << 30))  # MemTotal less the profile's reserve
    assert "MemAvailable" in out["warning"]  # the plan needs more than is free right now


def _fake_root(tmp_path, name: str, memtotal_kib: int | None = None):
    import shutil
    from pathlib import Path

    root = tmp_path / name
    shutil.copytree(Path(__file__).parents[1] / "fakes" / name, root)
    if memtotal_kib is not None:
        (root / "proc/meminfo").write_text(f"MemTotal:        {memtotal_kib} kB\nMemAvailable:    {memtotal_kib // 2} kB\n")
    return root


def test_plan_for_a_pi4_on_the_board_uses_its_measured_memory(tiny_bundle, tmp_path, capsys):
    """rpi4 has no memory size in its profile (1/2/4/8 GB boards): on a 2 GB board MemTotal decides
    the default budget (less the profile's 1 GiB reserve), and plan says where the number came from."""
    root = _fake_root(tmp_path, "rpi4", 1_893_000)
    rc = cli.main(["plan", str(tiny_bundle), "--device", "rpi4", "--root", str(root), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert out["memory_bytes"] == 1_893_000 * 1024
    assert out["budget_bytes"] == 1_893_000 * 1024 - (1 << 30)
    assert "measured on this board" in out["memory_source"]
    rc = cli.main(["plan", str(tiny_bundle), "--device", "rpi4", "--root", str(root)])
    text = capsys.readouterr().out
    assert "memory: 1.81 GiB measured on this board (/proc/meminfo MemTotal)" in text
    assert "of budget 825 MiB" in text and "memory budget 825 MiB is the rpi4 default" in text


def test_plan_for_a_pi4_elsewhere_says_whose_memory_it_used(tiny_bundle, tmp_path, capsys):
    root = _fake_root(tmp_path, "jetson-orin-nano")
    rc = cli.main(["plan", str(tiny_bundle), "--device", "rpi4", "--root", str(root)])
    text = capsys.readouterr().out
    assert rc == 0
    assert "measured on NVIDIA Jetson Orin Nano" in text and "rpi4 profile has no memory size" in text
    assert "--memory-budget" in text


def test_plan_for_a_board_with_a_size_elsewhere_uses_the_profile(tiny_bundle, tmp_path, capsys):
    root = _fake_root(tmp_path, "jetson-orin-nano")
    rc = cli.main(["plan", str(tiny_bundle), "--device", "rpi5-8gb", "--root", str(root), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["memory_bytes"] == 8 << 30 and "from the rpi5-8gb profile" in out["memory_source"]
    assert out["budget_bytes"] == (8 << 30) - int(1.5 * (1 << 30))


def test_engine_plans_like_plan_for_a_named_board_without_a_size(tiny_bundle, capsys):
    """What `plan --device rpi4` prints is what Engine.open(device="rpi4") does on the same machine."""
    from edgespec.engine import Engine

    rc = cli.main(["plan", str(tiny_bundle), "--device", "rpi4", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["budget_bytes"] == memcheck.meminfo("/")["MemTotal"] - (1 << 30)
    eng = Engine.open(tiny_bundle, device="rpi4", verify=False, warmup=False)
    try:
        assert eng.memory_plan.budget_bytes == out["budget_bytes"]
        assert eng.max_len == out["max_len"]
    finally:
        eng.close()


def test_plan_for_a_pi4_elsewhere_does_not_call_this_machines_memory_the_pi4_default(tiny_bundle, tmp_path, capsys):
    root = _fake_root(tmp_path, "jetson-orin-nano")
    rc = cli.main(["plan", str(tiny_bundle), "--device", "rpi4", "--root", str(root)])
    text = capsys.readouterr().out
    assert rc == 0 and "is the rpi4 default" not in text
    assert "not from a rpi4 (its profile has no memory size): give --memory-budget for the board you plan for" in text


def _tight_profile(tiny_bundle, *, draft: bool):
    """The rpi5-4gb profile shrunk so that the bundle's full plan does not fit but a shorter cache does
    (with the draft, or only without it): the case where a sum at the run's own max_len said NO."""
    import copy

    from edgespec.edge import devices

    p = copy.deepcopy(devices.profiles()["rpi5-4gb"])
    full = memory.plan(tiny_bundle, max_len=None, want_draft=True, profile=p, budget_bytes=None)
    floor = memory.plan(tiny_bundle, max_len=memory.MIN_MAX_LEN, want_draft=draft, budget_bytes=None)
    budget = (full.predicted_bytes + floor.predicted_bytes) // 2 if draft else floor.predicted_bytes
    p.memory_bytes = p.memory_reserve_bytes + budget
    return p, full


@pytest.mark.parametrize("draft", [True, False])
def test_bench_projection_and_plan_give_one_answer(tiny_bundle, capsys, draft):
    """`bench --project` used its own sum (the run's engine at its max_len) and said NO where `plan`
    shrank the cache and said 99 %: both read edge/boardfit.py now."""
    from edgespec.bench import projection
    from edgespec.edge import boardfit

    p, full = _tight_profile(tiny_bundle, draft=draft)
    assert full.predicted_bytes > p.memory_budget_bytes  # the old column's NO
    fit = boardfit.fit(tiny_bundle, p, want_draft=True)
    plan = memory.plan(tiny_bundle, max_len=None, want_draft=True, budget_bytes=None, profile=p)
    share = f"({100 * plan.predicted_bytes / plan.budget_bytes:.0f} %)"
    assert fit.fits is True and fit.text == (f"yes, max_len {plan.max_len} {share}" if draft
                                             else f"without the draft {share}")
    assert plan.load_draft is draft

    from dataclasses import replace

    work, costs, hw = _projection_inputs(tiny_bundle)
    hw = replace(hw, memory_budget_bytes=p.memory_budget_bytes)
    proj = projection.project(work, costs, hw, need_bytes=full.predicted_bytes, fit=fit.to_dict())
    assert proj.fits is True and proj.fit_text == fit.text
    assert projection.project(work, costs, hw, need_bytes=full.predicted_bytes).fits is False  # old JSONs


def test_a_board_too_small_for_the_target_says_no_with_the_numbers(tiny_bundle):
    import copy

    from edgespec.edge import boardfit, devices

    p = copy.deepcopy(devices.profiles()["rpi5-4gb"])
    p.memory_bytes = p.memory_reserve_bytes + (20 << 20)
    fit = boardfit.fit(tiny_bundle, p, want_draft=True)
    assert fit.fits is False and fit.text.startswith("NO: needs ") and fit.text.endswith(" of 20 MiB")
    p.memory_bytes = None
    assert boardfit.fit(tiny_bundle, p, want_draft=True).fits is None


def _projection_inputs(bundle):
    from edgespec.bench import projection
    from edgespec.bench.modework import ModeWork
    from edgespec.models.bundle import Bundle

    b = Bundle.open(bundle, verify=False)
    work = {"target": ModeWork("target", tokens=100, decode_s=2.0, target_steps={1: [100, 2.0]}, rounds=100,
                               context_sum=60.0, generations=1, prompt_tokens=20)}
    return work, projection.model_costs(b), projection.hardware("rpi5-4gb")


def test_plan_counts_the_embedder_and_the_document_index(tiny_bundle, tiny_embedder_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    files = sum(p.stat().st_size for p in tiny_embedder_dir.iterdir() if p.name != "manifest.json")
    rc = cli.main(["plan", str(tiny_bundle), "--embedder", str(tiny_embedder_dir), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["breakdown"]["embedder"] == int(memory.EMBEDDER_FILE_FACTOR * files) + memory.EMBEDDER_WORKING
    assert out["predicted_bytes"] == sum(out["breakdown"].values())
    index = tmp_path / "index"  # an index names the embedding model that built it; plan finds it by model_id
    index.mkdir()
    (index / "manifest.json").write_text(json.dumps({"embedder": {"model_id": "tiny-BERT/int8"}}))
    (index / "vectors.npy").write_bytes(bytes(1000))
    import shutil

    shutil.copytree(tiny_embedder_dir, tmp_path / "home" / "embedders" / "tiny")
    rc = cli.main(["plan", str(tiny_bundle), "--docs", str(index)])
    text = capsys.readouterr().out
    size = (index / "manifest.json").stat().st_size + 1000
    assert rc == 0 and "embedder" in text and "doc_index" in text
    p = memory.plan(tiny_bundle, max_len=None, want_draft=True, budget_bytes=None,
                    doc_lines={"embedder": int(memory.EMBEDDER_FILE_FACTOR * files) + memory.EMBEDDER_WORKING, "doc_index": int(2.0 * size)})
    assert units.format_size(p.predicted_bytes) in text


def test_plan_docs_without_a_readable_manifest_is_one_line(tiny_bundle, tmp_path, capsys):
    rc = cli.main(["plan", str(tiny_bundle), "--docs", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert rc == 1 and err == (f"edgespec plan: error: --docs {tmp_path}: no index here (manifest.json is missing): "
                               "build one with `edgespec index`")


def test_the_engines_memory_plan_counts_a_docs_index_and_its_embedder(tiny_bundle, tiny_embedder_dir, tmp_path, monkeypatch):
    import shutil

    from edgespec.engine import build

    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    shutil.copytree(tiny_embedder_dir, tmp_path / "home" / "embedders" / "tiny")
    index = tmp_path / "index"
    index.mkdir()
    (index / "manifest.json").write_text(json.dumps({"embedder": {"model_id": "tiny-BERT/int8"}}))
    b = Bundle.open(tiny_bundle)
    with_docs = build.memory_plan(b, max_len=300, want_draft=True, profile=None, budget=None, docs=index)
    alone = build.memory_plan(b, max_len=300, want_draft=True, profile=None, budget=None)
    files = sum(p.stat().st_size for p in tiny_embedder_dir.iterdir() if p.name != "manifest.json")
    assert with_docs.breakdown["embedder"] == int(memory.EMBEDDER_FILE_FACTOR * files) + memory.EMBEDDER_WORKING
    assert with_docs.breakdown["doc_index"] == int(2.0 * (index / "manifest.json").stat().st_size)
    assert with_docs.predicted_bytes - alone.predicted_bytes == with_docs.breakdown["embedder"] + with_docs.breakdown["doc_index"]
