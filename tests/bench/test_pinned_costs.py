"""`bench --pin-costs`: a replay whose decisions read one table of step costs, whatever the clock says.

The property that matters: two runs of the same code decide the same, even when the machine's speed
changes under one of them (the clock is perturbed here, so the test does not depend on timing)."""
from __future__ import annotations

import dataclasses
import itertools
import json
import types

import pytest

from edgespec.bench import run as bench
from edgespec.bench.pinned_costs import CostTable, PinnedCosts, load_pinned
from edgespec.bench.prompts import load_prompts
from edgespec.cli.main import main
from edgespec.core.runner import StepTimes
from edgespec.errors import InvalidRequest


def test_a_cost_table_interpolates_between_sizes_and_extends_past_them():
    t = CostTable({1: 0.030, 2: 0.040, 5: 0.060, 9: 0.080})
    assert t[3] == pytest.approx(0.040 + 0.020 / 3)  # between 2 and 5
    assert t[13] == pytest.approx(0.080 + 4 * (0.080 - 0.040) / 7)  # past 9: the slope of 2..9
    assert CostTable({2: 0.05, 4: 0.07})[1] == 0.05  # under the smallest size: its cost
    assert CostTable({4: 0.08})[8] == pytest.approx(0.16)  # one size: its cost per token
    assert CostTable({1: 0.03, 2: 0.02, 3: 0.01})[6] == 0.01  # a falling curve is not extended downward


def test_fixed_step_times_read_the_table_and_keep_the_measured_totals():
    st = StepTimes()
    for sec in (0.9, 0.5, 0.7):  # what a warmup timed before the fix
        st.add(1, sec)
    st.fix({1: 0.03, 4: 0.05}.get)
    assert st.recent_s == {}  # the earlier times are dropped from the medians
    for sec in (0.001, 5.0, 0.2):
        st.add(4, sec)
    assert st.recent_s == {4: 0.05} and st.total_s[4] == pytest.approx(5.201)
    # negative control: unfixed, the medians follow the clock
    free = StepTimes()
    for sec in (0.001, 5.0, 0.2):
        free.add(4, sec)
    assert free.recent_s == {4: 0.2}


def test_reprice_keeps_the_loops_own_time_and_prices_the_decode_steps():
    """A 40-token prompt's prefill (one 40-token step, before the first token: not in decode_s) keeps
    its measured 0.3 s; the decode steps cost the table's; the 0.1 s outside them stays."""
    pin = PinnedCosts(CostTable({1: 0.03, 3: 0.05}), CostTable({1: 0.01}), "x")
    s = bench.Sample("p", "c", "model", 0, 21, 40, 0.35, 1.5, 0.0, 1.85, 11, 20, 10, 0.5, 2.0, 2.0, "length",
                     100.0, True, None, target_steps={40: [1, 0.3], 1: [2, 0.2], 3: [8, 1.0]},
                     draft_steps={1: [20, 0.2]})
    r = pin.reprice(s)
    priced = 2 * 0.03 + 8 * 0.05 + 20 * 0.01
    assert r.decode_s == pytest.approx(0.1 + priced)  # 1.5 s measured, 1.4 s of it in decode steps
    assert r.decode_tps == pytest.approx(20 / (0.1 + priced))
    assert r.target_steps == {40: [1, 0.3], 1: [2, pytest.approx(0.06)], 3: [8, pytest.approx(0.4)]}
    assert r.draft_steps == {1: [20, pytest.approx(0.2)]}


@pytest.mark.parametrize("text, message", [
    ("{", "not JSON"),
    ('{"draft": {"1": 0.01}}', "expected a bench JSON"),
    ('{"target": {}}', "'target' must be a non-empty object"),
    ('{"target": {"one": 0.03}}', "'target' key 'one' is not a step size"),
    ('{"target": {"0": 0.03}}', "'target' key '0' is not a step size"),
    ('{"target": {"1": -0.03}}', "'target'[1] must be seconds > 0, got -0.03"),
    ('{"target": {"1": true}}', "'target'[1] must be seconds > 0, got True"),
    ('{"target": {"1": 0.03}, "draft": {"2": "fast"}}', "'draft'[2] must be seconds > 0, got 'fast'"),
    ('{"samples": [{"prompt_id": "x"}]}', "not a bench JSON written by `edgespec bench --json` (KeyError"),
    ('{"samples": []}', "the run has no decode steps to take costs from"),
])
def test_bad_cost_files_are_named(tmp_path, text, message):
    f = tmp_path / "costs.json"
    f.write_text(text)
    with pytest.raises(InvalidRequest, match="--pin-costs") as e:
        load_pinned(f)
    assert message in str(e.value)
    with pytest.raises(InvalidRequest, match="cannot read it"):
        load_pinned(tmp_path / "missing.json")


def test_a_cost_file_without_a_draft_table_refuses_a_mode_with_a_draft(tiny_bundle, tmp_path, capsys):
    f = tmp_path / "costs.json"
    f.write_text('{"target": {"1": 0.03, "2": 0.04}}')
    assert load_pinned(f).draft is None
    assert main(["bench", str(tiny_bundle), "--modes", "target,model", "--pin-costs", str(f), "--quiet"]) == 1
    assert "it prices no draft step, and model run one" in capsys.readouterr().err
    # a caller of run_bench that skips the CLI's check is stopped by apply(), before any step is fixed
    ns = types.SimpleNamespace
    eng = ns(target=ns(times=StepTimes()), draft_runner=ns(times=StepTimes()))
    with pytest.raises(InvalidRequest, match="it prices no draft step, and the engine runs a draft") as e:
        load_pinned(f).apply(eng)
    assert e.value.param == "pin_costs" and eng.target.times.fixed is None and eng.draft_runner.times.fixed is None


def _clock(step):
    """A perf_counter that advances by `step()` seconds per call: the machine's speed, as the runner sees it."""
    now = itertools.count()
    t = [0.0]

    def perf_counter():
        next(now)
        t[0] += step()
        return t[0]

    return types.SimpleNamespace(perf_counter=perf_counter, monotonic=perf_counter, time=perf_counter,
                                 sleep=lambda s: None)


def _decisions(run):
    return [(s.prompt_id, s.mode, s.repeat, s.rounds_by_source, {n: c for n, (c, _) in s.target_steps.items()},
             {n: c for n, (c, _) in s.draft_steps.items()}) for s in run.samples]


def test_a_pinned_run_decides_the_same_whatever_the_clock(tiny_bundle, monkeypatch):
    """The same prompts twice under `auto` and `model`, pinned: once with the clock as it is, once
    with every step taking 1-40 ms at random (a machine under a changing load). The rounds, the steps
    of each size and the sources chosen are the same; the decode times are the steps at the table's
    costs plus the loop's own time."""
    import random

    from edgespec.core import runner as runner_mod
    from edgespec.engine import Engine

    pin = PinnedCosts(CostTable({1: 0.030, 2: 0.034, 5: 0.050, 9: 0.070}), CostTable({1: 0.012, 2: 0.014, 64: 0.1}),
                      "test")
    prompts = load_prompts("code")[:2]
    modes = bench.parse_modes("target,auto,model", None, has_draft=True)
    runs = []
    for step in (None, lambda rng=random.Random(7): rng.uniform(0.001, 0.040)):
        if step is not None:
            monkeypatch.setattr(runner_mod, "time", _clock(step))
        engine = Engine.open(tiny_bundle, draft="auto", verify=False)
        try:
            runs.append(bench.run_bench(engine, prompts, modes, max_new_tokens=24, repeats=2, pin=pin))
        finally:
            engine.close()
        monkeypatch.undo()
    a, b = runs
    assert _decisions(a) == _decisions(b)
    assert a.meta["pinned_costs"]["source"] == "test" and a.meta["pinned_costs"]["target"][5] == 0.05
    for s in a.samples:  # decode steps hold at most 9 tokens here; the prompts' prefills, 100+
        assert sum(c for n, (c, _) in s.target_steps.items() if n > 9) == 1
        for n, (c, sec) in s.target_steps.items():
            assert n > 9 or sec == pytest.approx(c * pin.target[n])


def test_the_bench_command_replays_at_a_runs_costs(tiny_bundle, tmp_path, capsys):
    """A bench JSON is a cost file: its decode steps' mean cost per size. The replay says what it is."""
    first = tmp_path / "first.json"
    argv = ["bench", str(tiny_bundle), "--prompts", "code", "--limit", "1", "--repeats", "1",
            "--max-new-tokens", "12", "--modes", "target,model", "--project", "none", "--quiet"]
    assert main([*argv, "--json", str(first)]) == 0
    out = capsys.readouterr().out
    assert "REPLAY" not in out and "measured step costs on this machine: target step 1 tok" in out
    pin = load_pinned(first)
    assert set(pin.target) and set(pin.draft)
    replay = tmp_path / "replay.json"
    assert main([*argv, "--pin-costs", str(first), "--json", str(replay)]) == 0
    out = capsys.readouterr().out
    assert f"REPLAY at pinned step costs from {first}" in out and "not a speed measurement" in out
    meta = json.loads(replay.read_text())["meta"]
    assert {int(n): v for n, v in meta["pinned_costs"]["target"].items()} == pytest.approx(dict(pin.target))
    # a saved run's decisions are done: it cannot be replayed, only reported
    assert main(["bench", str(replay), "--pin-costs", str(first), "--project", "none"]) == 1
    assert "--pin-costs replays the decisions of a new run" in capsys.readouterr().err
    assert main(["bench", str(replay), "--project", "none"]) == 0
    assert "REPLAY at pinned step costs" in capsys.readouterr().out  # the saved replay still says what it is


def _pair():
    """Model costs of a 1.5B int4 target and a 0.5B draft, as projection.model_costs reads a bundle."""
    from edgespec.bench.projection import ModelCost

    return {"target": ModelCost("target", 1_100_000_000, 1_500_000_000, 28, 28_672),
            "draft": ModelCost("draft", 420_000_000, 500_000_000, 24, 12_288)}


def test_a_board_is_priced_by_the_projection_at_its_slow_end():
    from edgespec.bench.pinned_costs import device_pinned, pinned_device
    from edgespec.bench.projection import PIN_CONTEXT, step_seconds

    assert pinned_device("costs.json") is None  # a file, read by load_pinned
    hw = pinned_device("device:orin-nano")  # an alias, as --project and --device take it
    assert hw.id == "jetson-orin-nano-8gb" and hw.flavor == "cuda"
    costs = _pair()
    pin = device_pinned(hw, costs)
    tgt, drf = costs["target"].for_flavor("cuda")[0], costs["draft"].for_flavor("cuda")[0]
    for n in (1, 5, 9):
        assert pin.target[n] == pytest.approx(step_seconds(tgt, hw, n, PIN_CONTEXT, overlap=False))
    # the slow end: a verify grows with its length, where the overlapping end prices 1 and 9 tokens alike
    assert step_seconds(tgt, hw, 9, PIN_CONTEXT) == pytest.approx(step_seconds(tgt, hw, 1, PIN_CONTEXT))
    assert pin.target[9] > pin.target[5] > pin.target[1]
    assert pin.draft[512] == pytest.approx(step_seconds(drf, hw, 512, PIN_CONTEXT, overlap=False))  # a prompt read
    assert pin.draft[1] < pin.target[1]
    assert pin.source.startswith("device:jetson-orin-nano-8gb") and "projected, not measured" in pin.source
    # cpu graphs priced as the board's cuda ones: the replay says so, as --project does
    assert "the bundle's target has no cuda graph: priced as if re-exported with --ep cuda" in pin.source
    assert "the bundle's draft has no cuda graph" in pin.source
    cuda = {r: dataclasses.replace(m, flavor="cuda") for r, m in costs.items()}
    assert "no cuda graph" not in device_pinned(hw, cuda).source
    # a bundle without a draft: no draft table, so a mode with a draft is refused as for a file
    alone = device_pinned(hw, {"target": costs["target"]})
    with pytest.raises(InvalidRequest, match="it prices no draft step"):
        alone.need_draft("model runs one")


@pytest.mark.parametrize("spec, message", [
    ("device:", "names no board"),
    ("device:pdp-11", "unknown device 'pdp-11'"),
    ("device:generic-x86_64", "no projection for generic-x86_64"),
])
def test_a_board_without_a_cost_model_is_named(spec, message):
    from edgespec.bench.pinned_costs import pinned_device

    with pytest.raises(InvalidRequest) as e:
        pinned_device(spec)
    assert e.value.param == "pin_costs" and str(e.value).startswith(f"--pin-costs {spec}: ")
    assert message in str(e.value) and "jetson-orin-nano-8gb" in str(e.value)  # the boards that work


def test_the_bench_command_replays_at_a_boards_costs(tiny_bundle, tmp_path, capsys):
    """`--pin-costs device:ID` re-decides at the board's modelled costs for this bundle, and says so."""
    from edgespec.bench.pinned_costs import device_pinned, pinned_device
    from edgespec.bench.projection import model_costs
    from edgespec.models.bundle import Bundle

    out = tmp_path / "board.json"
    argv = ["bench", str(tiny_bundle), "--prompts", "code", "--limit", "1", "--repeats", "1",
            "--max-new-tokens", "12", "--modes", "target,model", "--project", "none", "--quiet"]
    assert main([*argv, "--pin-costs", "device:jetson-orin-nano-8gb", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "REPLAY at pinned step costs from device:jetson-orin-nano-8gb" in text and "projected" in text
    # the step-cost line under the breakdown is the board's table, not this machine's clock
    assert "measured step costs on this machine" not in text
    assert "step costs pinned for this replay (not measured): target step 1 tok" in text
    meta = json.loads(out.read_text())["meta"]
    want = device_pinned(pinned_device("device:jetson-orin-nano-8gb"), model_costs(Bundle.open(tiny_bundle, verify=False)))
    assert {int(n): v for n, v in meta["pinned_costs"]["target"].items()} == pytest.approx(dict(want.target))
    assert {int(n): v for n, v in meta["pinned_costs"]["draft"].items()} == pytest.approx(dict(want.draft))
    # a bad board is refused before the models load
    assert main([*argv, "--pin-costs", "device:pdp-11"]) == 1
    err = capsys.readouterr().err
    assert "--pin-costs device:pdp-11: unknown device 'pdp-11'" in err and "loading" not in err
