"""Settings resolved once (engine/settings.py) and the one table of drafting modes (drafters/modes.py):
each bad value is one named error before any bundle is read, and every place that lists modes (help
texts, the server's validation, the batched refusals, the bench, the engine's drafters) reads the table."""
from __future__ import annotations

import dataclasses

import pytest

from edgespec.bench import run as bench
from edgespec.cli.main import main
from edgespec.drafters import modes
from edgespec.engine import Engine
from edgespec.engine.requests import Options
from edgespec.engine.settings import Settings
from edgespec.errors import BundleNotFound, InvalidRequest
from edgespec.limits import TREE_MODES
from edgespec.server import validate


@pytest.mark.parametrize("kw,param,words", [
    ({"draft": "fast"}, "draft", "unknown drafter 'fast': choose one of auto, model, suffix, docs, recycle, ngram, self, heads, grammar, none"),
    ({"k": 0}, "k", "k must be an integer from 1 to 16"),
    ({"tree": "maybe"}, "tree", "unknown tree mode 'maybe': choose one of auto, on, off"),
    ({"max_len": 1}, "max_len", "max_len must be an integer >= 2"),
    ({"suffix_capacity": 8}, "suffix_capacity", "suffix index capacity must be an integer >= 16"),
    ({"parallel": 0}, "parallel", "parallel must be an integer from 1 to 64, got 0"),
    ({"parallel": 65}, "parallel", "parallel must be an integer from 1 to 64, got 65"),
    ({"deterministic": True, "tree": "on"}, "tree", "tree='on' is not possible in deterministic mode"),
])
def test_each_bad_setting_is_one_named_error(kw, param, words):
    with pytest.raises(InvalidRequest) as e:
        Settings.of(**kw)
    assert e.value.param == param and words in str(e.value) and "\n" not in str(e.value)


def test_settings_are_frozen_and_converted_once():
    s = Settings.of(memory_budget="1GiB", power_budget="10W", max_temp="80C", providers="cuda,cpu",
                    deterministic=True)
    assert (s.memory_budget, s.power_budget_w, s.max_temp_c) == (1 << 30, 10.0, 80.0)
    assert s.providers == ("CUDAExecutionProvider", "CPUExecutionProvider")
    assert s.deterministic is True
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.k = 4  # type: ignore[misc]
    assert s.replace(k=4).k == 4 and s.k is None
    with pytest.raises(TypeError, match="unknown engine option"):
        Settings.of(drafts="auto")


def test_engine_open_takes_settings_or_keywords_not_both(tmp_path):
    with pytest.raises(TypeError, match="either settings or keyword options"):
        Engine.open(tmp_path / "none", Settings(), k=2)
    with pytest.raises(BundleNotFound):  # any parallel opens the one engine: the missing bundle stops it
        Engine.open(tmp_path / "none", parallel=2)


def test_help_texts_list_every_mode_of_the_table(capsys):
    """generate --help once omitted suffix and recycle: the help now comes from the table."""
    for cmd in ("generate", "chat", "serve"):
        with pytest.raises(SystemExit):
            main([cmd, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        for m in modes.MODES:  # "name: the first words of its help" ("name (default): ..." for the default)
            words = " ".join(m.help.split()[:3])
            assert f"{m.name}: {words}" in text or f"{m.name} (default): {words}" in text, (cmd, m.name)


def test_the_server_the_bench_and_the_batch_read_the_table():
    # the server passes a request's names on; the engine's request options look them up, once
    req = validate.parse_request("completion", b'{"prompt": "x", "draft": "fast", "tree": "wide"}', validate.Limits())
    with pytest.raises(InvalidRequest) as e:
        Options(**req.engine_kwargs())
    assert e.value.param == "draft" and f"choose one of {', '.join(modes.NAMES)}" in str(e.value)
    with pytest.raises(InvalidRequest) as e:
        Options(**{**req.engine_kwargs(), "draft": None})
    assert e.value.param == "tree" and f"choose one of {', '.join(TREE_MODES)}" in str(e.value)
    assert set(bench.MODES) == {"target", *modes.NAMES} - {"none"}
    assert set(bench.FIXED_K_MODES) == {m.name for m in modes.MODES if m.fixed_k}
    for name in modes.NAMES:
        assert Settings.of(parallel=3, draft=name).draft == name


def test_bench_opens_its_engine_with_the_mode_that_loads_what_its_columns_need():
    from edgespec.cli.commands.bench import engine_mode

    pick = lambda names: engine_mode(bench.parse_modes(names, None, has_draft=True))  # noqa: E731
    assert pick("target,ngram,suffix") == "ngram"  # nothing but the target
    assert pick("target,model,ngram") == "model"  # the draft model alone (no heads, no self-draft)
    assert pick("target,heads,suffix") == "heads"  # the heads alone, not the draft model too
    assert pick("target,model,auto") == "auto"  # auto: the draft model and the heads
    assert pick("target,self,suffix,auto") == "self"  # the self-draft (its auto has it)


def test_the_engine_builds_every_row_it_has_a_runner_for(tiny_bundle):
    eng = Engine.open(tiny_bundle, max_len=64, warmup=False)
    try:
        # tiny_bundle has a draft model, no self-draft record and no heads; the engine has no documents
        assert set(eng.modes()) == {m.name for m in modes.MODES if m.runner not in ("self", "heads", "docs")}
        ranked = [m.name for m in sorted((m for m in modes.MODES if m.auto_rank is not None
                                          and m.runner not in ("self", "heads", "docs")), key=lambda m: m.auto_rank)]
        assert eng.auto_sources() == ranked == ["suffix", "model", "grammar"]
    finally:
        eng.close()


def test_heads_is_one_row_the_engine_builds_when_the_bundle_has_them(tiny_heads_bundle):
    eng = Engine.open(tiny_heads_bundle, max_len=64, warmup=False)
    try:
        assert "heads" in eng.modes() and "heads" in eng.auto_sources()
    finally:
        eng.close()
