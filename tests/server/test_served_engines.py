"""Engine and BatchEngine both provide every member of the server's ServedEngine protocol, with the
same meaning: the handlers read them directly (server/served.py)."""
from __future__ import annotations

import pytest

from edgespec.engine import Engine
from edgespec.engine.batch import BatchEngine
from edgespec.server.metrics import memory_gauges

MEMBERS = ("model_name", "max_len", "slots", "knowledge", "pinned", "governor", "drafter_stats",
           "prepare", "count_tokens", "generate", "close")


@pytest.mark.parametrize("parallel", [None, 2])
def test_both_engines_provide_what_the_server_reads(tiny_bundle, parallel):
    if parallel is None:
        eng = Engine.open(tiny_bundle, max_len=64, draft="suffix", suffix_capacity=48, verify=False, warmup=False)
    else:
        eng = BatchEngine.open(tiny_bundle, parallel=parallel, max_len=64, draft="suffix", suffix_capacity=48,
                               verify=False, warmup=False)
    try:
        missing = [m for m in MEMBERS if not hasattr(eng, m)]
        assert missing == []
        assert eng.slots == (parallel or 1)
        assert eng.knowledge is None and eng.pinned is None  # no --docs, no --system-prompt
        assert eng.model_name == "qwen-agree"  # the tiny bundle's name
        # prepare: the request checked and tokenized once; the engine runs the Prepared as it is
        p = eng.prepare("def add(a, b):", max_new_tokens=4)
        assert p.prompt_tokens == eng.count_tokens("def add(a, b):") and p.request.ids == eng.encode("def add(a, b):")
        with pytest.raises(TypeError, match="pass max_new_tokens to prepare"):
            eng.stream(p, max_new_tokens=8) if parallel is None else eng.submit(p, max_new_tokens=8)
        assert eng.generate(p).text == eng.generate("def add(a, b):", max_new_tokens=4).text
        eng.reset_cache()
        if parallel is None:
            eng.generate("def add(a, b):", max_new_tokens=4)
        # the suffix index's figures reach /metrics through drafter_stats (the batched engine's: the
        # finished requests' shared history)
        g = memory_gauges(eng)
        assert g["edgespec_suffix_index_capacity_tokens"][1] == 48
        assert g["edgespec_suffix_index_tokens"][1] == (0 if parallel else len(eng.encode("def add(a, b):")) + 4)
    finally:
        eng.close()


def test_metrics_before_an_engine_is_loaded_report_no_index():
    g = memory_gauges(None)
    assert g["edgespec_suffix_index_tokens"][1] == 0 and g["edgespec_suffix_index_capacity_tokens"][1] == 0
