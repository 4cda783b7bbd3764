"""The projection's cost model (bench/projection.py) and the work it prices (bench/modework.py), on
hand-made numbers (no models needed): the roofline, the inversion of acceptance, the replay of step
counts, and the boards it knows from the device profiles."""
from __future__ import annotations

import pytest

from edgespec.bench import modework as mw, projection as pj
from edgespec.errors import InvalidRequest

GPU = pj.Hardware("gpu", "a GPU board", bandwidth_gbs=100, compute_tops=10, path="gpu", eff_bandwidth=1.0,
                  eff_compute=1.0, launch_ms_per_layer=0.0, cpu_speed=1.0)
CPU = pj.Hardware("cpu", "a CPU board", bandwidth_gbs=100, compute_tops=0.5, path="cpu", eff_bandwidth=1.0,
                  eff_compute=1.0, launch_ms_per_layer=0.0, cpu_speed=0.5)
TARGET = pj.ModelCost("target", weight_bytes=1_000_000_000, params=1_500_000_000, layers=28, kv_bytes_per_token=0)
DRAFT = pj.ModelCost("draft", weight_bytes=400_000_000, params=500_000_000, layers=24, kv_bytes_per_token=0)


def test_roofline_memory_bound_then_compute_bound():
    # GPU: 1 GB at 100 GB/s = 10 ms; compute 3e9 flops/token at 10 TOPS = 0.3 ms/token -> flat up to ~33 tokens
    assert pj.step_seconds(TARGET, GPU, 1, 0) == pytest.approx(0.010)
    assert pj.step_seconds(TARGET, GPU, 9, 0) == pytest.approx(0.010)
    # CPU board: 6 ms of compute per token -> a 9-token verify costs 9 x 6 = 54 ms, not 10
    assert pj.step_seconds(TARGET, CPU, 1, 0) == pytest.approx(0.010)
    assert pj.step_seconds(TARGET, CPU, 9, 0) == pytest.approx(0.054)


def test_kv_cache_and_launch_costs_are_added():
    m = pj.ModelCost("t", 1_000_000_000, 1, layers=10, kv_bytes_per_token=1_000_000)
    hw = pj.Hardware("x", "x", 100, 1000, "x", 1.0, 1.0, launch_ms_per_layer=0.1, cpu_speed=1.0)
    # 1 GB weights + 1000 positions x 1 MB of KV = 2 GB at 100 GB/s = 20 ms; + 10 layers x 0.1 ms
    assert pj.step_seconds(m, hw, 1, 1000) == pytest.approx(0.021)


@pytest.mark.parametrize("a, k", [(0.3, 2), (0.7, 4), (0.9, 8), (0.5, 1)])
def test_acceptance_inversion_round_trips(a, k):
    rounds = 1000
    accepted = rounds * sum(a ** i for i in range(1, k + 1))
    assert mw.per_token_acceptance(round(accepted), rounds, k) == pytest.approx(a, abs=2e-3)


def test_acceptance_inversion_edges():
    assert mw.per_token_acceptance(0, 10, 4) == 0.0
    assert mw.per_token_acceptance(40, 10, 4) == 1.0
    assert mw.per_token_acceptance(5, 0, 4) is None


def _work(mode: str, tokens: int, target_steps: dict, draft_steps: dict | None = None, decode_s: float = 0.0,
          **kw) -> mw.ModeWork:
    w = mw.ModeWork(mode, tokens=tokens, decode_s=decode_s, generations=1, prompt_tokens=100, context_sum=164, **kw)
    w.target_steps = {n: [c, 0.0] for n, c in target_steps.items()}
    w.draft_steps = {n: [c, 0.0] for n, c in (draft_steps or {}).items()}
    return w


def test_project_replays_the_step_counts():
    work = {
        "target": _work("target", 100, {1: 100}),
        # 25 rounds of k=4 that yielded 4 tokens each: 25 verifies of 5 tokens and 100 draft steps
        "model": _work("model", 100, {5: 25}, {1: 100}, rounds=25, drafted=100, accepted=75),
        "ngram": _work("ngram", 100, {1: 50, 3: 25}),
    }
    costs = {"target": TARGET, "draft": DRAFT}
    p = pj.project(work, costs, GPU)
    by = {m.mode: m for m in p.modes}
    t1, d1 = 0.010, 0.004  # GPU: both memory bound
    assert by["target"].tokens_per_s == pytest.approx(100 / (100 * t1))
    assert by["model"].tokens_per_s == pytest.approx(100 / (25 * t1 + 100 * d1))
    assert by["model"].speedup == pytest.approx((100 * t1) / (25 * t1 + 100 * d1))
    assert by["ngram"].speedup == pytest.approx(100 / 75)
    assert p.step_ms["target"][1] == pytest.approx(10.0) and p.step_ms["draft"][1] == pytest.approx(4.0)
    best = next(m for m in p.modes if m.mode.startswith("model, k="))
    assert "a=" in best.note and best.speedup > 1.0


def test_acceptance_comes_from_fixed_k_when_the_run_has_it():
    adaptive = _work("model", 100, {2: 50}, {1: 50}, rounds=50, drafted=50, accepted=45)  # a = 0.9, optimistic
    fixed = _work("model k=4", 100, {5: 40}, {1: 160}, rounds=40, drafted=160, accepted=60)
    a, source, _ = mw.acceptance_estimate({"model": adaptive})
    assert a == pytest.approx(0.9, abs=1e-3) and "optimistic" in source
    a, source, w = mw.acceptance_estimate({"model": adaptive, "model k=4": fixed, "model k=2": adaptive})
    assert w is fixed and source == "(from 'model k=4')"
    assert sum(a ** i for i in range(1, 5)) == pytest.approx(60 / 40, abs=1e-3)
    assert mw.acceptance_estimate({"ngram": adaptive}) is None


def test_loop_overhead_scales_with_the_board_cpu():
    work = {"target": _work("target", 100, {1: 100}, decode_s=0.1)}  # steps measured as 0 s: all overhead
    fast = pj.project(work, {"target": TARGET}, GPU).modes[0]
    slow = pj.project(work, {"target": TARGET}, CPU).modes[0]
    assert fast.overhead_s_per_token == pytest.approx(0.001)
    assert slow.overhead_s_per_token == pytest.approx(0.002)  # cpu_speed 0.5


def test_same_acceptance_pays_more_where_verify_is_flat():
    """The point of the projection: a verify of k+1 tokens costs ~one step on a bandwidth-bound GPU
    but k+1 steps' compute on a compute-poor CPU, so the same measured run projects a larger
    speed-up on the former."""
    work = {"target": _work("target", 100, {1: 100}),
            "model": _work("model", 100, {9: 20}, {1: 160}, rounds=20, drafted=160, accepted=80)}
    costs = {"target": TARGET, "draft": DRAFT}
    gpu = {m.mode: m for m in pj.project(work, costs, GPU).modes}
    cpu = {m.mode: m for m in pj.project(work, costs, CPU).modes}
    assert gpu["model"].speedup > 1.0 > cpu["model"].speedup


def test_project_needs_the_target_alone():
    with pytest.raises(ValueError, match="target-alone"):
        pj.project({"model": _work("model", 10, {2: 5})}, {"target": TARGET}, GPU)


def test_collect_work_takes_the_prefill_out():
    from edgespec.bench.run import Sample

    s = Sample("p", "c", "target", 0, new_tokens=11, prompt_tokens=40, ttft_s=0.5, decode_s=1.0, decode_tps=10.0,
               total_s=1.5, target_passes=11, drafted=0, accepted=0, acceptance=None, tokens_per_pass=1.0, k_mean=0.0,
               finish_reason="length", peak_rss_mb=1.0, same_as_target=None, first_diff=None,
               target_steps={40: [1, 0.4], 1: [10, 0.8]})
    w = mw.collect_work([s])["target"]
    assert w.target_steps == {1: [10, 0.8]}
    assert w.tokens == 10 and w.overhead_s == pytest.approx(0.2)
    assert mw.prefill_chunks(1100, 512) == [512, 512, 76]


# --- device profiles ---------------------------------------------------------------------------
def test_boards_from_device_profiles():
    hw = pj.hardware("orin-nano")
    assert hw.id == "jetson-orin-nano-8gb" and hw.bandwidth_gbs == 68 and "GPU" in hw.path
    pi = pj.hardware("pi5")
    assert pi.bandwidth_gbs == 17 and "A76" in pi.path
    # Jetson: a 9-token verify of the default target costs about one step; on a Pi 5 its compute shows
    t = pj.ModelCost("t", 1_130_000_000, 1_540_000_000, 28, 28672)
    jet = pj.step_seconds(t, hw, 9, 300) / pj.step_seconds(t, hw, 1, 300)
    cpu = pj.step_seconds(t, pi, 9, 300) / pj.step_seconds(t, pi, 1, 300)
    assert jet < 1.05 and cpu > jet + 0.2


def test_boards_listing():
    boards = pj.projectable(distinct=True)
    assert set(boards) == {"jetson-orin-nano-8gb", "jetson-orin-nx-16gb", "jetson-agx-orin-64gb", "rpi5-4gb", "rpi4"}
    assert len(pj.projectable()) > len(boards)
    assert [h.id for h in pj.resolve_devices("boards")] == boards
    assert pj.resolve_devices("none") == [] and pj.resolve_devices(None) == []


def test_unprojectable_and_unknown_devices():
    with pytest.raises(InvalidRequest, match="no projection for generic-aarch64"):
        pj.hardware("generic-aarch64")
    with pytest.raises(InvalidRequest, match="unknown device"):
        pj.resolve_devices("orin-nano,commodore-64")


def test_cost_model_is_stated():
    lines = pj.cost_model_text([pj.hardware("orin-nano")])
    assert "max(bytes" in lines[0] and "jetson-orin-nano-8gb: B=68 GB/s" in lines[2]


def test_fits_uses_the_memory_estimate_when_given():
    work = {"target": _work("target", 10, {1: 10})}
    small = pj.Hardware("s", "s", 10, 1, "cpu", 1, 1, 0, 1, memory_budget_bytes=2 << 30)
    assert pj.project(work, {"target": TARGET}, small).fits is True  # 1 GB weights + 15 %
    assert pj.project(work, {"target": TARGET}, small, need_bytes=3 << 30).fits is False
    assert pj.project(work, {"target": TARGET}, GPU).fits is None  # no budget in the profile


def test_overlap_and_no_overlap_bound_each_projection():
    # CPU board, 9 tokens: memory 10 ms, compute 54 ms -> overlapping 54 ms, adding up 64 ms
    assert pj.step_seconds(TARGET, CPU, 9, 0, overlap=False) == pytest.approx(0.064)
    work = {"target": _work("target", 100, {1: 100}),
            "model": _work("model", 100, {5: 25}, {1: 100}, rounds=25, drafted=100, accepted=75)}
    p = pj.project(work, {"target": TARGET, "draft": DRAFT}, GPU)
    by = {m.mode: m for m in p.modes}
    t1, d1 = 0.010 + 0.0003, 0.004 + 0.0001  # adding up: memory + compute of one token
    assert by["target"].tokens_per_s_low == pytest.approx(100 / (100 * t1))
    for m in p.modes:
        assert m.tokens_per_s_low is not None and m.tokens_per_s_low <= m.tokens_per_s
    assert by["model"].speedup_low == pytest.approx((100 * t1) / (25 * (0.010 + 5 * 0.0003) + 100 * d1))


def test_the_flavor_the_board_runs_is_priced():
    """A Jetson runs the cuda flavor (float16 KV); a bundle without one is priced as if re-exported, with a note."""
    jet = pj.hardware("jetson-orin-nano-8gb")
    pi = pj.hardware("rpi5-8gb")
    assert jet.flavor == "cuda" and pi.flavor == "cpu" and "MatMulNBits" in jet.path
    both = pj.ModelCost("target", 1000, 10, 2, kv_bytes_per_token=400, graphs={"cpu": (1000, 400), "cuda": (900, 200)})
    m, note = both.for_flavor("cuda")
    assert (m.weight_bytes, m.kv_bytes_per_token, note) == (900, 200, "")
    cpu_only = pj.ModelCost("target", 1000, 10, 2, kv_bytes_per_token=400)
    m, note = cpu_only.for_flavor("cuda")
    assert m.kv_bytes_per_token == 200 and "--ep cuda" in note
    work = {"target": _work("target", 100, {1: 100})}
    p = pj.project(work, {"target": cpu_only}, jet)
    assert p.flavor == "cuda" and any("--ep cuda" in n for n in p.notes)
    assert pj.project(work, {"target": cpu_only}, pi).notes == []
