"""The GPU check at a real model's shape (bench/shapecheck.py, scripts/gpu-check.sh --shape-check): the shapes
are the real pair's, the projection replays a bench run's steps with measured costs, and the whole check runs end
to end on the CPU provider at a small shape (what a lease runs on CUDA at the real one)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edgespec.bench import shapecheck

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu-check.sh"


def test_slope_is_the_least_squares_cost_of_one_more_token():
    costs = {n: 0.010 + 0.002 * n for n in range(1, 17)}
    s = shapecheck.slope(costs)
    assert s["s_per_token"] == pytest.approx(0.002) and s["intercept_s"] == pytest.approx(0.010)
    assert s["ratio_last_first"] == pytest.approx(0.042 / 0.012)


def test_projection_replays_each_modes_steps_with_these_costs():
    steps = {"models": {"target": {"io_binding": {"1": 0.010, "2": 0.011, "5": 0.012}},
                        "draft": {"io_binding": {"1": 0.002}}}}
    bench = {"samples": [
        # the target alone: 10 tokens, one 8-token prefill and 9 decode steps
        {"mode": "target", "new_tokens": 10, "target_steps": {"8": [1, 9.9], "1": [9, 9.9]}, "draft_steps": {}},
        # a drafting mode: the same prefill, 2 verifies of 5 tokens, 8 draft steps
        {"mode": "model k=4", "new_tokens": 10, "target_steps": {"8": [1, 9.9], "5": [2, 9.9]},
         "draft_steps": {"1": [8, 9.9]}},
    ]}
    rows = {r["mode"]: r for r in shapecheck.project(steps, bench)}
    slope = shapecheck.slope({1: 0.010, 2: 0.011, 5: 0.012})["s_per_token"]
    prefill = 0.012 + slope * 3  # 8 tokens: past the largest measured (5), along the fitted slope
    alone = prefill + 9 * 0.010
    spec = prefill + 2 * 0.012 + 8 * 0.002
    assert rows["target"]["projected_tok_s"] == pytest.approx(10 / alone)
    assert rows["model k=4"]["projected_speedup"] == pytest.approx(alone / spec)
    assert rows["model k=4"]["draft_steps"] == 8 and "projected_speedup" not in rows["target"]


def test_the_shapes_are_the_default_pairs_and_the_small_ones_build_fast():
    t, d = shapecheck.shape("target"), shapecheck.shape("draft")
    assert (t["hidden"], t["layers"], t["heads"], t["kv_heads"], t["ffn"], t["vocab"]) == (1536, 28, 12, 2, 8960, 151936)
    assert (d["hidden"], d["layers"], d["heads"], d["kv_heads"], d["ffn"], d["vocab"]) == (896, 24, 14, 2, 4864, 151936)
    assert shapecheck.shape("target", small=True)["layers"] < 8
    with pytest.raises(ValueError, match="target or draft"):
        shapecheck.shape("head")


@pytest.mark.slow
@pytest.mark.parametrize("name, role", [("qwen2.5-coder-1.5b-instruct", "target"), ("qwen2.5-coder-0.5b-instruct", "draft")])
def test_the_shapes_match_the_real_ggufs(real_gguf, name, role):
    gguf = pytest.importorskip("gguf")
    r = gguf.GGUFReader(str(real_gguf(name)))

    def value(key):
        f = r.fields[f"qwen2.{key}"]
        return int(f.parts[f.data[0]][0])

    want = shapecheck.shape(role)
    assert (value("embedding_length"), value("block_count"), value("attention.head_count"),
            value("attention.head_count_kv"), value("feed_forward_length")) == (
        want["hidden"], want["layers"], want["heads"], want["kv_heads"], want["ffn"])
    embed = next(t for t in r.tensors if t.name == "token_embd.weight")
    assert int(embed.shape[1]) == want["vocab"] and embed.tensor_type.name == want["types"]["embed"]


@pytest.mark.slow  # about 15 s alone: two GGUFs written, exported, and timed
def test_the_shape_check_runs_end_to_end_on_the_cpu_provider_at_a_small_shape(tmp_path):
    if shutil.which("timeout") is None:
        pytest.skip("coreutils' timeout is not on PATH")
    env = os.environ | {"PYTHON": sys.executable,
                        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "export"), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run(["bash", str(SCRIPT), "--shape-check", "--small", "-o", str(tmp_path / "report")],
                       capture_output=True, text=True, env=env, timeout=900, cwd=ROOT)
    summary = (tmp_path / "report" / "summary.md").read_text()
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:] + summary
    assert "0 step(s) failed" in summary and "GPU: none used: --small runs on the CPU provider" in summary
    for step in ("| ggufs | 0 |", "| export-shapes | 0 |", "| step-costs | 0 |"):
        assert step in summary, step
    assert "(SMALL stand-in shape on the CPU provider: not the real sizes)" in summary
    steps = json.loads((tmp_path / "report" / "steps.json").read_text())
    assert steps["provider"] == "cpu" and set(steps["models"]) == {"target", "draft"}
    for role, row in steps["models"].items():
        assert row["placed_on"] == "cpu" and row["layers"] == shapecheck.shape(role, small=True)["layers"]
        assert sorted(int(n) for n in row["io_binding"]) == list(range(1, 17))
        assert all(v > 0 for v in row["io_binding"].values())
        assert set(row["batched"]) == {"1", "2", "3", "4"} and row["batched_one_pass"] is False  # cuda flavor
        assert "not offered by the cpu provider" in row["cuda_graph_error"]
    assert "verify slope" in summary and "without I/O binding" in summary and "batch 4:" in summary
    if (ROOT / "scripts/gpu-check-qwen-coder-cpu.json").exists():
        modes = {p["mode"] for p in steps["projection"]}
        assert "target" in modes and len(modes) > 1 and "projected (acceptance from the real pair's" in summary


def test_the_shape_check_plan_names_every_step_and_runs_nothing(tmp_path):
    env = os.environ | {"PYTHON": sys.executable, "PYTHONPATH": str(ROOT)}
    r = subprocess.run(["bash", str(SCRIPT), "--shape-check", "--small", "--plan", "-o", str(tmp_path / "report")],
                       capture_output=True, text=True, env=env, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    for step in ("[versions,", "[ggufs,", "[export-shapes,", "[step-costs,"):
        assert step in r.stdout, step
    assert "--ep cuda --force --parity-tokens 16" in r.stdout and not (tmp_path / "report").exists()
    r = subprocess.run(["bash", str(SCRIPT), "--small", "-o", str(tmp_path / "report")], capture_output=True, text=True,
                       env=env, timeout=60, cwd=ROOT)
    assert r.returncode == 2 and "--small goes with --shape-check" in r.stderr
