"""The cache contract: in-place KV, multi-token steps, rewind, capacity."""
import numpy as np
import pytest

from edgespec.models.bundle import Bundle
from edgespec.engine.build import load_runner
from edgespec.core.runner import CacheFull

pytestmark = pytest.mark.arm64  # the cache's arithmetic: run on the emulated aarch64 too (tests/edge/test_arm64.py)


@pytest.fixture
def runner(tiny_bundle):
    b = Bundle.open(tiny_bundle)
    return load_runner(b.model_path("target"), b.target, 64)


def test_incremental_steps_equal_one_full_pass(runner):
    toks = list(np.random.RandomState(0).randint(0, 400, 20))
    full = runner.step(toks, 20).copy()
    runner.reset()
    rows = [runner.step(toks[:9], 9).copy()]
    for t in toks[9:14]:
        rows.append(runner.step([t], 1).copy())
    rows.append(runner.step(toks[14:], 6).copy())
    np.testing.assert_allclose(np.concatenate(rows), full, atol=1e-4)
    assert runner.length == 20


def test_rewind_then_rewrite_is_exact(runner):
    toks = list(np.random.RandomState(1).randint(0, 400, 12))
    full = runner.step(toks, 12).copy()
    runner.rewind(8)
    runner.step([5, 6, 7], 3)  # garbage rows 8..10
    runner.rewind(8)
    again = runner.step(toks[8:], 4)
    np.testing.assert_allclose(again, full[8:], atol=1e-4)


def test_only_requested_logit_rows_come_back(runner):
    out = runner.step([1, 2, 3, 4, 5], 2)
    assert out.shape == (2, runner.vocab_size)


def test_cache_full_writes_nothing(runner):
    runner.step(list(range(60)), 1)
    with pytest.raises(CacheFull):
        runner.step([1, 2, 3, 4, 5], 1)
    assert runner.length == 60
    runner.step([1, 2, 3, 4], 1)
    assert runner.length == 64


def test_rewind_past_length_is_refused(runner):
    runner.step([1, 2, 3], 1)
    with pytest.raises(ValueError):
        runner.rewind(4)


def test_step_times_record_recent_cost_by_size(runner):
    for _ in range(3):
        runner.step([1], 1)
    runner.step([1, 2, 3], 3)
    t = runner.times
    assert t.count[1] == 3 and t.count[3] == 1
    assert t.recent(1) > 0 and t.mean(1) > 0 and t.recent(2) is None


def test_step_times_first_run_does_not_dominate():
    from edgespec.core.runner import StepTimes

    t = StepTimes()
    t.add(1, 5.0)  # the first run pays one-off allocation
    t.add(1, 0.1)
    assert t.recent(1) == 0.1
    for _ in range(20):
        t.add(1, 0.2)
    assert abs(t.recent(1) - 0.2) < 0.01
