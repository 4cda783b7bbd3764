"""One request's lifecycle (engine/sequence.py) is the same in both engines: a request driven
through the serial Engine and through a BatchEngine (alone in it) ends with the same tokens, text,
finish and every statistic but the clocks'."""
from __future__ import annotations

import dataclasses

import pytest

from edgespec.engine import Engine
from edgespec.engine.results import GenerationStats

CLOCKS = {"ttft_s", "prefill_s", "decode_tokens_per_second", "total_s"}  # seconds measured, not counted
PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):"


@pytest.fixture(scope="module")
def engines(tiny_bundle):
    opts = dict(draft="auto", max_len=160, verify=False, warmup=False, deterministic=True)
    serial = Engine.open(tiny_bundle, **opts)
    batch = Engine.open(tiny_bundle, parallel=2, **opts)
    yield serial, batch
    serial.close()
    batch.close()


def _counted(stats: GenerationStats) -> dict:
    return {f.name: getattr(stats, f.name) for f in dataclasses.fields(stats) if f.name not in CLOCKS}


@pytest.mark.parametrize("draft,k,stop,max_new", [
    ("none", None, None, 20),
    ("ngram", 3, None, 30),
    ("model", 2, None, 24),
    ("ngram", 4, "b\n", 40),  # a stop string ends both at the same token
    ("model", 3, None, 1),  # the first token is the last
])
def test_one_request_through_both_engines_gives_every_stat_alike(engines, draft, k, stop, max_new):
    serial, batch = engines
    serial.reset_cache()
    batch.reset_cache()
    ask = dict(prompt=PROMPT, max_new_tokens=max_new, draft=draft, k=k, stop=stop, tree="off")
    for turn in range(2):  # the second reuses the prompt's cache in both (prefix reuse)
        a = serial.generate(**ask)
        b = batch.generate(**ask)
        assert (a.token_ids, a.text, a.finish_reason) == (b.token_ids, b.text, b.finish_reason)
        assert _counted(a.stats) == _counted(b.stats), turn
        assert a.stats.new_tokens == len(a.token_ids) > 0 and a.stats.prompt_tokens > 10
        assert a.stats.cached_tokens == (0 if turn == 0 else a.stats.prompt_tokens - 1)
        if k is not None and max_new > 1:
            assert a.stats.rounds > 0 and a.stats.drafted > 0  # the drafter ran in both, with the same verdicts


def test_cancel_before_the_prompt_is_read_ends_alike(engines):
    serial, batch = engines
    ask = dict(prompt=PROMPT, max_new_tokens=8, cancel=lambda: True, tree="off")
    a, b = serial.generate(**ask), batch.generate(**ask)
    assert a.finish_reason == b.finish_reason == "cancelled" and a.token_ids == b.token_ids == []
    assert a.stats.new_tokens == b.stats.new_tokens == 0 and a.stats.prompt_tokens == b.stats.prompt_tokens
