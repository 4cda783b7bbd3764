"""`edgespec loadtest` and the --parallel option: bad input is refused clearly; a tiny run reports
both servers at every level; the memory planner counts slots."""
from __future__ import annotations

import argparse

import pytest

from edgespec import limits
from edgespec.edge import memory
from edgespec.models.bundle import Bundle
from edgespec.errors import DraftUnavailable, InvalidRequest
from edgespec.bench.loadtest import loadtest, parse_levels, report
from edgespec.server.config import ConfigError, ServerConfig

pytest.importorskip("uvicorn", reason="the server extra is not installed (pip install .[server])")


@pytest.mark.parametrize("text", ["", "0,1", "a,b", "1,65"])
def test_bad_concurrency_levels(text):
    with pytest.raises(InvalidRequest, match="concurrency"):
        parse_levels(text)


def test_levels_sorted_and_unique():
    assert parse_levels("4,1,2,2") == [1, 2, 4]


@pytest.mark.parametrize("value", ["0", "65", "many"])
def test_bad_parallel_option(value, tiny_bundle):
    from edgespec.cli.commands.serve import _parallel
    from edgespec.engine.settings import Settings

    with pytest.raises(ConfigError, match="--parallel"):
        _parallel(value, tiny_bundle, Settings())


def test_parallel_in_the_server_config():
    with pytest.raises(ConfigError, match="parallel"):
        ServerConfig(parallel=0).check()
    ServerConfig(parallel=4).check()


def test_auto_parallel_counts_slots_in_the_budget(tiny_bundle):
    from edgespec.cli.commands.serve import _parallel
    from edgespec.engine.settings import Settings

    b = Bundle.open(tiny_bundle, verify=False)
    plan = memory.plan(b, max_len=256, want_draft=False, budget_bytes=None)
    per = memory.slot_bytes(b.target, 256)
    # a slot costs its cache, its verify rows of logits and the suffix index of its own text (max_len
    # tokens and the last sampled one): not a copy of the shared history, whatever its capacity
    kv, own = b.target.kv_bytes_per_token(), memory.suffix_index_bytes(257)
    assert per == kv * 257 + 9 * b.target.vocab_size * 4 + own
    assert own == 258 * limits.SUFFIX_BYTES_PER_TOKEN and per < memory.suffix_index_bytes(limits.SUFFIX_CAPACITY)
    assert memory.slot_bytes(b.target, 257) - per == kv + limits.SUFFIX_BYTES_PER_TOKEN
    assert memory.slots_that_fit(b, plan, plan.predicted_bytes) == 1  # nothing left after one slot
    assert memory.slots_that_fit(b, plan, plan.predicted_bytes + 2 * per) == 3
    assert memory.slots_that_fit(b, plan, plan.predicted_bytes + 100 * per) == memory.MAX_AUTO_SLOTS
    budget = plan.predicted_bytes + per + per // 2
    assert _parallel("auto", tiny_bundle, Settings.of(max_len=256, memory_budget=budget, draft="none")) == 2
    # a mode that loads the draft model gives it a cache slot per request slot: counted per slot too
    with_draft = memory.plan(b, max_len=256, want_draft=True, budget_bytes=None)
    per_draft = per + b.draft.kv_bytes_per_token() * 257
    assert memory.slots_that_fit(b, with_draft, with_draft.predicted_bytes + 2 * per_draft) == 3
    assert memory.slots_that_fit(b, with_draft, with_draft.predicted_bytes + 2 * per_draft - 1) == 2


def test_tiny_loadtest_reports_both_servers(tiny_bundle):
    res = loadtest(tiny_bundle, levels=[1, 2], drafts=["none"], requests=3, max_tokens=6,
                   engine_options={"max_len": 512, "verify": False})
    assert [(r.server, r.concurrency) for r in res] == [("serial", 1), ("serial", 2), ("batched", 1), ("batched", 2)]
    for r in res:
        assert r.requests == 3 and r.tokens > 0 and r.aggregate_tps > 0 and r.ttft_p95 >= r.ttft_p50 > 0
        # prompt passes are left out of the decode figure: every request spent some time in one
        assert all(c.prefill_s > 0 for c in r.runs) and r.decode_tps > 0
        assert r.decode_tps == pytest.approx((r.tokens - r.requests) / (r.wall_s - sum(c.prefill_s for c in r.runs)))
    assert all(r.batch_size_mean == 1.0 for r in res if r.server == "serial")
    text = report(res)
    assert "vs serial" in text and "batched" in text


@pytest.mark.parametrize("parallel", [1, 2])
def test_serve_and_loadtest_open_one_engine_at_every_parallel(tiny_bundle, parallel):
    """One engine (issue 62): --parallel sets its slots, not which class serves."""
    from edgespec.bench.loadtest import serve
    from edgespec.cli.commands.serve import engine_opener
    from edgespec.engine import Engine
    from edgespec.engine.settings import Settings

    eng = engine_opener(tiny_bundle, Settings.of(max_len=64, verify=False, warmup=False, parallel=parallel), None)()
    try:
        assert (type(eng), eng.slots) == (Engine, parallel)
    finally:
        eng.close()
    with serve(tiny_bundle, parallel=parallel, engine_options={"max_len": 64, "verify": False}) as served:
        assert (type(served.engine), served.engine.slots) == (Engine, parallel)


def test_loadtest_refuses_a_mode_the_bundle_cannot_draft_with(tiny_bundle, capsys):
    from edgespec.cli.commands.loadtest import run

    args = argparse.Namespace(bundle=str(tiny_bundle), concurrency="1", draft="self", prompts="code", requests=1,
                              max_tokens=2, max_len=512, threads=None, json=None)
    with pytest.raises(DraftUnavailable, match="has no self-draft"):
        run(args)


@pytest.mark.parametrize("argv, message", [
    (["--parallel", "2", "--suffix-capacity", "8"], "suffix index capacity must be an integer >= 16 tokens, got 8"),
    (["--suffix-capacity", "8"], "suffix index capacity must be an integer >= 16 tokens, got 8"),
    (["--parallel", "2", "--draft", "self"], "has no self-draft"),
    (["--parallel", "2", "--draft", "heads"], "has no draft heads"),
])
def test_serve_refuses_engine_options_before_loading(tiny_bundle, capsys, argv, message):
    """Checked before the bundle loads: exit 78 (the unit does not restart) and one line."""
    from edgespec.cli.main import main

    assert main(["serve", str(tiny_bundle), *argv]) == 78
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("url", ["https://127.0.0.1:8080", "127.0.0.1:8080", "http://127.0.0.1", "http://:8080",
                                 "http://127.0.0.1:99999", "http://127.0.0.1:8080/?x=1"])
def test_bad_url(url):
    from edgespec.bench.loadtest import parse_url

    with pytest.raises(InvalidRequest, match="--url must look like"):
        parse_url(url)


def test_url_prefix_before_v1():
    from edgespec.bench.loadtest import Target, parse_url

    assert parse_url("http://localhost:8080") == Target("localhost", 8080, "")
    assert parse_url("http://localhost:8080/v1/") == Target("localhost", 8080, "")
    assert parse_url("http://10.0.0.2:80/llm/v1") == Target("10.0.0.2", 80, "/llm")


def test_loadtest_of_a_running_server_by_url(tiny_bundle):
    """--url measures a server that is already up (here an edgespec one; llama-server in docs/speed.md)."""
    from edgespec.bench.loadtest import loadtest_url, serve

    with serve(tiny_bundle, parallel=2, engine_options={"max_len": 512, "verify": False}) as served:
        res = loadtest_url(f"http://127.0.0.1:{served.port}", levels=[1, 2], requests=3, max_tokens=5, label="other")
    assert [(r.server, r.draft, r.concurrency) for r in res] == [("other", "server", 1), ("other", "server", 2)]
    assert all(r.requests == 3 and r.tokens > 0 and r.aggregate_tps > 0 for r in res)
    assert "other" in report(res)


def test_loadtest_url_with_nobody_listening_and_bad_arguments(tiny_bundle, capsys):
    import socket

    from edgespec.cli.main import main

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nobody listens there now
    from edgespec.bench.loadtest import loadtest_url

    with pytest.raises(InvalidRequest, match=f"no server answers at http://127.0.0.1:{port}"):
        loadtest_url(f"http://127.0.0.1:{port}", levels=[1], requests=1, max_tokens=2)
    assert main(["loadtest", str(tiny_bundle), "--url", f"http://127.0.0.1:{port}"]) == 1
    assert "not both" in capsys.readouterr().err
    assert main(["loadtest"]) == 1
    assert "needs a bundle to serve, or --url" in capsys.readouterr().err
