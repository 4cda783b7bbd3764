"""The engine provides every member of the server's ServedEngine protocol at any --parallel, with the
meaning the server reads (server/served.py), and so does the server tests' fake engine: the members
are read from the Protocol itself, so neither can drift from it."""
from __future__ import annotations

import inspect

import pytest

from edgespec.engine import Engine
from edgespec.engine.results import GenerationResult, Ticket
from edgespec.server.metrics import memory_gauges
from edgespec.server.served import ServedEngine
from helpers.fake_server import FakeEngine

MEMBERS = sorted({*ServedEngine.__annotations__,
                  *(n for n, v in vars(ServedEngine).items() if inspect.isfunction(v) and not n.startswith("_"))})


def test_the_protocol_lists_what_the_server_calls():
    assert MEMBERS == ["close", "count_tokens", "docs", "drafter_stats", "generate", "governor", "last_batch",
                       "max_len", "model_name", "pinned", "prepare", "round", "slots", "submit"]


def _run(eng, prepared) -> tuple[Ticket, list[str]]:
    """What the server's worker does: submit, then rounds until the ticket is done."""
    deltas: list[str] = []
    t = eng.submit(prepared, on_delta=deltas.append)
    while not t.done.is_set():
        eng.round()
    return t, deltas


@pytest.mark.parametrize("parallel", [1, 2])
def test_the_engine_provides_what_the_server_reads(tiny_bundle, parallel):
    eng = Engine.open(tiny_bundle, parallel=parallel, max_len=64, draft="suffix", suffix_capacity=48, verify=False,
                      warmup=False)
    try:
        missing = [m for m in MEMBERS if not hasattr(eng, m)]
        assert missing == []
        assert eng.slots == parallel
        assert eng.docs is None and eng.pinned is None  # no --docs, no --system-prompt
        assert eng.model_name == "qwen-agree"  # the tiny bundle's name
        # prepare: the request checked and tokenized once; the engine runs the Prepared as it is
        p = eng.prepare("def add(a, b):", max_new_tokens=4)
        assert p.prompt_tokens == eng.count_tokens("def add(a, b):") and p.request.ids == eng.encode("def add(a, b):")
        with pytest.raises(TypeError, match="pass max_new_tokens to prepare"):
            eng.submit(p, max_new_tokens=8)
        want = eng.generate("def add(a, b):", max_new_tokens=4)
        t, deltas = _run(eng, p)
        assert t.error is None and isinstance(t.result, GenerationResult)
        assert t.result.text == want.text == "".join(deltas) and t.result.stats.new_tokens == 4
        assert eng.last_batch == 1  # the last round verified this request alone
        # the suffix index's capacity reaches /metrics through drafter_stats
        g = memory_gauges(eng)
        assert g["edgespec_suffix_index_capacity_tokens"][1] == 48
    finally:
        eng.close()


def test_the_fake_engine_provides_what_the_server_reads():
    eng = FakeEngine(slots=2)
    assert [m for m in MEMBERS if not hasattr(eng, m)] == []
    t, deltas = _run(eng, eng.prepare("hello there", max_new_tokens=3))
    assert isinstance(t, Ticket) and isinstance(t.result, GenerationResult)
    assert (t.result.text, deltas, t.result.finish_reason) == (" w0 w1 w2", [" w0", " w1", " w2"], "length")
    assert eng.generate("hello there", max_new_tokens=2).text == " w0 w1"


def test_metrics_before_an_engine_is_loaded_report_no_index():
    g = memory_gauges(None)
    assert g["edgespec_suffix_index_tokens"][1] == 0 and g["edgespec_suffix_index_capacity_tokens"][1] == 0
