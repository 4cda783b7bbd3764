"""`edgespec bench`: prompt files, modes, the interleaved run on the tiny bundles (outputs must equal
the target's: fp32 graphs make the lossless property exact), the report, the JSON and the plot.
No speed is asserted anywhere: speeds are what the bench reports, not what a test checks."""
from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from edgespec.bench import prompts as prompt_sets
from edgespec.bench import run as bench

from edgespec.bench import report as bench_report
from edgespec.cli.main import main
from edgespec.errors import DraftUnavailable, InvalidRequest


# --- prompt sets and files -------------------------------------------------------------------------
@pytest.mark.parametrize("name, categories", [("code", {"write", "complete", "refactor", "explain"}),
                                              ("chat", {"summarise", "answer", "rewrite", "translate"})])
def test_shipped_prompt_sets(name, categories):
    ps = prompt_sets.load_prompts(name)
    assert len(ps) >= 12
    assert {p.category for p in ps} == categories
    assert len({p.id for p in ps}) == len(ps)
    for p in ps:
        assert p.request() == {"messages": [{"role": "user", "content": p.prompt}]}
        assert len(p.prompt) > 20


def test_sets_combine_with_commas():
    ps = prompt_sets.load_prompts("code,chat")
    assert {p.set for p in ps} == {"code", "chat"}


def _write(tmp_path: Path, text: str) -> str:
    f = tmp_path / "p.jsonl"
    f.write_text(text, encoding="utf-8")
    return str(f)


def test_user_prompt_file(tmp_path):
    path = _write(tmp_path, "\n".join([
        '# comments and blank lines are skipped',
        '',
        '{"id": "a", "category": "x", "prompt": "hello"}',
        '{"category": "y", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]}',
        '{"id": "c", "prompt": "def f(", "raw": true, "max_new_tokens": 5}',
    ]))
    a, b, c = prompt_sets.load_prompts(path)
    assert a.request() == {"messages": [{"role": "user", "content": "hello"}]}
    assert b.id == "p-4" and b.request()["messages"][0]["role"] == "system"
    assert c.request() == {"prompt": "def f("} and c.max_new_tokens == 5 and c.category == "default"


@pytest.mark.parametrize("line, message", [
    ("{not json", "p.jsonl:1: not valid JSON"),
    ('["a"]', "must be a JSON object"),
    ('{"category": "x"}', "exactly one of 'prompt'"),
    ('{"prompt": "a", "messages": []}', "exactly one of 'prompt'"),
    ('{"prompt": "   "}', "'prompt' must be a non-empty string"),
    ('{"messages": [{"role": "user"}]}', "'messages' must be a non-empty list"),
    ('{"prompt": "a", "category": 3}', "'category' must be a non-empty string"),
    ('{"prompt": "a", "max_new_tokens": 0}', "'max_new_tokens' must be a positive integer"),
    ('{"prompt": "a", "raw": "yes"}', "'raw' must be true or false"),
    ('{"prompt": "a", "promt": "typo"}', "unknown key(s) ['promt']"),
    ('{"prompt": "a", "json_schema": "object"}', "'json_schema' must be a JSON schema object"),
])
def test_bad_prompt_lines_are_named(tmp_path, line, message):
    with pytest.raises(InvalidRequest) as ei:
        prompt_sets.load_prompts(_write(tmp_path, line))
    assert message in str(ei.value)


def test_every_problem_is_listed_with_its_line(tmp_path):
    path = _write(tmp_path, '{"prompt": "ok"}\n{bad\n{"prompt": ""}\n')
    with pytest.raises(InvalidRequest, match=r"2 problem\(s\)") as ei:
        prompt_sets.load_prompts(path)
    assert "p.jsonl:2:" in str(ei.value) and "p.jsonl:3:" in str(ei.value)


def test_empty_file_missing_file_duplicate_ids(tmp_path):
    with pytest.raises(InvalidRequest, match="no prompts"):
        prompt_sets.load_prompts(_write(tmp_path, "\n# nothing\n"))
    with pytest.raises(InvalidRequest, match="not a built-in set"):
        prompt_sets.load_prompts(str(tmp_path / "nope.jsonl"))
    with pytest.raises(InvalidRequest, match="appears twice"):
        prompt_sets.load_prompts(_write(tmp_path, '{"id": "a", "prompt": "x"}\n{"id": "a", "prompt": "y"}\n'))


# --- modes ---------------------------------------------------------------------------------------
def test_modes_target_first_and_fixed_k_variants():
    ms = bench.parse_modes("auto,model,ngram", "4,2,4", has_draft=True)
    assert [m.label for m in ms] == ["target", "auto", "model", "model k=4", "model k=2", "ngram", "ngram k=4",
                                     "ngram k=2"]
    assert ms[0].draft == "none" and not ms[0].speculative


def test_tree_variants_of_the_modes():
    ms = bench.parse_modes("auto,auto+tree,model+tree-auto", "3", has_draft=True)
    assert [m.label for m in ms] == ["target", "auto", "auto+tree", "model+tree-auto", "model+tree-auto k=3"]
    assert [m.tree for m in ms] == ["off", "off", "on", "auto", "auto"]
    assert bench.split_tree("ngram+tree") == ("ngram", "on") and bench.split_tree("ngram") == ("ngram", "off")


def test_the_structured_set_runs_every_mode_under_its_schemas_and_reports_the_forced_share(tiny_bundle):
    """Every shipped schema compiles; the answers (modes side by side) equal the constrained target's,
    and the report gives the share of tokens the grammar forced, the same in every mode."""
    from edgespec.engine import Engine

    ps = prompt_sets.load_prompts("structured")
    assert len(ps) >= 12 and all(isinstance(p.json_schema, dict) for p in ps)
    assert ps[0].generation()["json_schema"] == ps[0].json_schema and "json_schema" not in ps[0].request()
    eng = Engine.open(tiny_bundle, draft="auto", max_len=512)
    try:
        for p in ps:  # a schema the library refused would raise here
            eng.stream(**p.generation(), max_new_tokens=1).close()
        modes = bench.parse_modes("grammar,auto", None, has_draft=True)
        run = bench.run_bench(eng, ps[:3], modes, max_new_tokens=40, repeats=1)
    finally:
        eng.close()
    assert all(s.same_as_target for s in run.samples if s.mode != "target")
    forced = {s.mode: 0 for s in run.samples}
    for s in run.samples:
        forced[s.mode] += s.forced_tokens
    assert forced["target"] > 0 and len(set(forced.values())) == 1
    lines = bench_report.report_text(run)
    assert "the share of output tokens the grammar forced" in lines and f"target: {forced['target']} of" in lines


def test_a_tree_run_reports_its_trees_and_round_trips_through_json(tiny_bundle, tmp_path):
    """Fixed k (the model always proposes 2), so whether rounds draft does not depend on measured
    costs: every drafted round of the +tree mode is a tree, none of the chain mode's."""
    from edgespec.engine import Engine

    prompts = prompt_sets.load_prompts("code")[2:4]
    modes = [m for m in bench.parse_modes("model,model+tree", "2", has_draft=True) if m.draft == "none" or m.k]
    eng = Engine.open(tiny_bundle, draft="auto", max_len=512)
    try:
        run = bench.run_bench(eng, prompts, modes, max_new_tokens=24, repeats=1)
    finally:
        eng.close()
    chain = [s for s in run.samples if s.mode == "model k=2"]
    tree = [s for s in run.samples if s.mode == "model+tree k=2"]
    assert chain and tree
    assert all(s.tree_rounds == 0 for s in chain) and all(s.tree_rounds > 0 for s in tree)
    assert all(s.same_as_target for s in tree)
    lines = bench_report.tree_lines(run)
    assert len(lines) == 1 and lines[0].startswith("  model+tree k=2:") and "accepted depth" in lines[0]
    path = tmp_path / "run.json"
    bench_report.write_json(path, bench_report.report_json(run))
    again = bench.load_run(path)
    assert [m.label for m in again.modes] == ["target", "model k=2", "model+tree k=2"] and again.modes[2].tree == "on"
    assert bench_report.tree_lines(again) == lines


@pytest.mark.parametrize("modes, ks, err, msg", [
    ("target,beam", None, InvalidRequest, "unknown mode"),
    ("target+tree", None, InvalidRequest, "unknown mode"),
    ("auto+bush", None, InvalidRequest, "unknown mode"),
    ("target", None, InvalidRequest, "nothing to compare"),
    ("model", None, DraftUnavailable, "no draft model"),
    ("ngram", "2,x", InvalidRequest, "'x' is not an integer"),
    ("ngram", "0", InvalidRequest, "from 1 to 16"),
])
def test_bad_modes(modes, ks, err, msg):
    with pytest.raises(err, match=msg):
        bench.parse_modes(modes, ks, has_draft=False)


# --- a real run on the tiny bundles ----------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_run(tiny_bundle):
    from edgespec.engine import Engine

    prompts = prompt_sets.load_prompts("code")[2:5]  # write, complete, complete
    modes = bench.parse_modes("target,model,ngram,auto", "2", has_draft=True)
    eng = Engine.open(tiny_bundle, draft="auto", max_len=512)
    try:
        seen = []
        run = bench.run_bench(eng, prompts, modes, max_new_tokens=20, repeats=2,
                              on_sample=lambda s, d, t: seen.append((d, t)))
    finally:
        eng.close()
    return run, seen


def test_run_covers_every_prompt_mode_repeat_once(tiny_run):
    run, seen = tiny_run
    keys = [(s.prompt_id, s.mode, s.repeat) for s in run.samples]
    assert len(keys) == len(set(keys)) == 3 * 6 * 2
    assert seen[-1] == (36, 36) and [d for d, _ in seen] == list(range(1, 37))


def test_modes_are_interleaved_and_rotated(tiny_run):
    run, _ = tiny_run
    # the samples of one (repeat, prompt) are contiguous: modes run back to back on each prompt
    blocks = [(s.repeat, s.prompt_id) for s in run.samples]
    changes = sum(1 for a, b in zip(blocks, blocks[1:]) if a != b)
    assert changes == 2 * 3 - 1
    # rotated per prompt and per repeat: each prompt's first mode differs between its repeats, and
    # within a repeat from one prompt to the next
    first = {}
    for i, s in enumerate(run.samples):
        if i == 0 or blocks[i] != blocks[i - 1]:
            first[blocks[i]] = s.mode
    prompts = list(dict.fromkeys(s.prompt_id for s in run.samples))
    assert all(first[(0, p)] != first[(1, p)] for p in prompts), first
    assert len({first[(0, p)] for p in prompts}) == len(prompts), first


def test_each_prompt_starts_with_another_mode_each_repeat_even_with_as_many_prompts_as_modes():
    modes = bench.parse_modes("target,model,auto", None, has_draft=True)
    for prompt in range(3):
        firsts = [bench.mode_order(modes, rep, prompt)[0].label for rep in range(3)]
        assert sorted(firsts) == ["auto", "model", "target"], (prompt, firsts)


def test_speculative_outputs_equal_the_target_alone(tiny_run):
    """The lossless property on real prompts through the whole engine: fp32 graphs, greedy."""
    run, _ = tiny_run
    for s in run.samples:
        if s.mode == "target":
            assert s.same_as_target is None
        else:
            assert s.same_as_target is True, (s.prompt_id, s.mode, s.first_diff)
    by = {(s.prompt_id, s.repeat, s.mode): s.text for s in run.samples}
    for (pid, rep, mode), text in by.items():
        assert text == by[(pid, rep, "target")]


def test_samples_carry_consistent_stats(tiny_run):
    run, _ = tiny_run
    for s in run.samples:
        assert 1 <= s.new_tokens <= 20 and s.prompt_tokens > 20
        assert s.ttft_s > 0 and s.decode_s >= 0 and s.peak_rss_mb > 10
        steps = sum(c for c, _ in s.target_steps.values())
        assert steps == s.target_passes, "every target pass is in the step histogram (prefill: one chunk)"
        if s.mode == "target":
            assert s.drafted == 0 and s.acceptance is None and s.draft_steps == {}
            assert set(s.target_steps) == {s.prompt_tokens, 1} or s.new_tokens == 1
        else:
            assert 0 <= s.accepted <= s.drafted
        if s.mode.startswith("model k="):
            assert s.draft_steps, "the draft model ran"
        elif s.mode == "model" and s.rounds_by_source.get("model", 0):  # adaptive: it may decline a
            assert s.draft_steps, "the draft model ran"  # prompt prefill the reply cannot pay back
        if s.mode.startswith("ngram"):
            assert s.draft_steps == {}, "n-gram lookup runs no model"


def test_fixed_k_is_respected(tiny_run):
    run, _ = tiny_run
    for s in run.samples:
        if s.mode == "model k=2":
            assert all(n <= 3 for n in s.target_steps if n != s.prompt_tokens)


def test_summary_rows_and_ratios(tiny_run):
    run, _ = tiny_run
    rows = bench_report.summarize(run)
    groups = list(dict.fromkeys(r.group for r in rows))
    assert groups == ["write", "complete", "all"]
    for r in rows:
        if r.mode == "target":
            assert r.speedup == pytest.approx(1.0)
        else:
            base = next(x for x in rows if x.group == r.group and x.mode == "target")
            assert r.speedup == pytest.approx(r.tokens_per_s / base.tokens_per_s)
            assert r.same == r.compared > 0
            lo, hi = r.speedup_range
            assert lo <= hi
    all_target = next(r for r in rows if r.group == "all" and r.mode == "target")
    assert all_target.generations == 6 and all_target.tokens_per_pass == pytest.approx(1.0, abs=0.2)


def test_pooled_throughput_is_tokens_over_time():
    def s(new, dec, mode="target", rep=0):
        return bench.Sample("p", "c", mode, rep, new, 30, 0.1, dec, 0.0, dec + 0.1, new, 0, 0, None, 1.0, 0.0, "length",
                            100.0, None, None)

    run = bench.BenchRun(meta={}, modes=[bench.Mode("none"), bench.Mode("ngram")],
                         prompts=[bench.Prompt("p", "c", "x")],
                         samples=[s(11, 1.0), s(21, 1.0, rep=1), s(11, 0.5, "ngram"), s(21, 2.0, "ngram", 1)])
    rows = {r.mode: r for r in bench_report.summarize(run) if r.group == "c"}
    assert rows["target"].tokens_per_s == pytest.approx(30 / 2.0)
    assert rows["ngram"].tokens_per_s == pytest.approx(30 / 2.5)
    assert rows["ngram"].speedup == pytest.approx(0.8)
    assert rows["ngram"].speedup_range == pytest.approx((0.5, 2.0))


def test_breakdown_adds_up(tiny_run):
    run, _ = tiny_run
    for b in bench_report.breakdown(run):
        parts = b.target_ms_per_token + b.draft_ms_per_token + b.draft_catchup_ms_per_token + b.overhead_ms_per_token
        # the draft's prompt prefill runs before the first token: counted in decode, it would leave
        # the loop a negative share (clamped to 0) and the parts would add up to more than the whole
        assert parts == pytest.approx(b.decode_ms_per_token, rel=0.02), b.mode
        assert b.target_steps, b.mode
        assert all(n < bench.PREFILL_MIN_TOKENS for n in b.target_steps), "prefill is not decode time"


def test_report_text_and_json(tiny_run, tmp_path):
    run, _ = tiny_run
    text = bench_report.report_text(run)
    assert "speed-up" in text and "where the decode time goes" in text
    assert "PROJECTION" not in text  # nothing modelled unless asked
    out = tmp_path / "r.json"
    bench_report.write_json(out, bench_report.report_json(run))
    d = json.loads(out.read_text())
    assert d["meta"]["repeats"] == 2 and d["meta"]["max_new_tokens"] == 20
    assert len(d["samples"]) == 36 and d["modes"][0] == "target"
    assert {r["group"] for r in d["summary"]["by_category"]} == {"write", "complete", "all"}
    assert len({r["group"] for r in d["summary"]["by_prompt"]}) == 3
    assert d["projection"] == []


def test_plot_png(tiny_run, tmp_path):
    pytest.importorskip("matplotlib")
    from edgespec.bench.plot import plot

    run, _ = tiny_run
    out = plot(bench_report.summarize(run), tmp_path / "b.png", title="t")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def test_plot_without_matplotlib_is_one_clear_error(monkeypatch, tiny_bundle, capsys):
    import builtins

    real_import = builtins.__import__

    def no_mpl(name, *a, **k):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_mpl)
    assert main(["bench", str(tiny_bundle), "--plot", "x.png"]) == 1
    err = capsys.readouterr().err
    assert "--plot needs matplotlib: pip install 'edgespec[plot]'" in err


# --- the command ---------------------------------------------------------------------------------
def test_bench_command_end_to_end(tiny_bundle, tmp_path, capsys):
    out_json, out_png = tmp_path / "b.json", tmp_path / "b.png"
    argv = ["bench", str(tiny_bundle), "--prompts", "code", "--limit", "2", "--repeats", "1", "--max-new-tokens", "12",
            "--modes", "target,ngram,model", "--json", str(out_json), "--project", "pi5,orin-nano", "--quiet"]
    try:
        import matplotlib  # noqa: F401

        argv += ["--plot", str(out_png)]
    except ImportError:
        out_png = None
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "write" in text and "target" in text and "ngram" in text
    assert "PROJECTION to boards" in text and "NOT a measurement" in text and "rpi5-8gb" in text
    d = json.loads(out_json.read_text())
    assert [p["device"] for p in d["projection"]] == ["rpi5-8gb", "jetson-orin-nano-8gb"]
    assert all(p["kind"].startswith("projection") for p in d["projection"])
    # "fits memory" is the memory plan `edgespec plan --device` runs (edge/boardfit.py), for every board
    from edgespec.edge import boardfit, devices

    for p in d["projection"]:
        want = boardfit.fit(tiny_bundle, devices.profiles()[p["device"]], want_draft=True)
        assert (p["fits"], p["fit_text"]) == (want.fits, want.text) and want.text.startswith("yes (")
    assert set(d["meta"]["board_fits"]) == set(devices.profiles())
    if out_png:
        assert out_png.exists()
    # the saved run reports, plots and projects again without measuring: same measured table
    assert main(["bench", str(out_json), "--project", "agx-orin"]) == 0
    again = capsys.readouterr().out
    assert again.split("PROJECTION")[0] == text.split("PROJECTION")[0]
    assert "jetson-agx-orin-64gb" in again and "rpi5-8gb" not in again


def test_saved_run_that_is_not_a_bench_json(tmp_path, capsys):
    bad = tmp_path / "x.json"
    bad.write_text('{"hello": 1}')
    assert main(["bench", str(bad)]) == 1
    assert "not a bench JSON written by `edgespec bench --json`" in capsys.readouterr().err


def test_bench_command_bad_inputs_fail_before_loading(tiny_bundle_nodraft, tmp_path, capsys):
    cases = [
        (["--modes", "model"], "no draft model"),
        (["--prompts", str(tmp_path / "missing.jsonl")], "not a built-in set"),
        (["--repeats", "0"], "--repeats must be at least 1"),
        (["--project", "toaster"], "unknown device 'toaster'"),
        (["--project", "generic-x86_64"], "no projection for generic-x86_64"),
    ]
    for extra, msg in cases:
        assert main(["bench", str(tiny_bundle_nodraft), *extra]) == 1, extra
        assert msg in capsys.readouterr().err, extra
    assert main(["bench", str(tmp_path / "no-bundle")]) == 1
    assert "does not exist" in capsys.readouterr().err


def test_prompts_too_long_for_the_cache_are_named_up_front(tiny_bundle_nodraft, capsys):
    # the tiny models hold 512 positions; the long chat prompts need more with their byte-level tokenizer
    assert main(["bench", str(tiny_bundle_nodraft), "--prompts", "chat", "--repeats", "1", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "do not fit the cache of 512 tokens: chat-summarise-1 (" in err


def test_bench_on_a_bundle_without_draft_defaults_to_what_it_can(tiny_bundle_nodraft, capsys):
    assert main(["bench", str(tiny_bundle_nodraft), "--limit", "1", "--repeats", "1", "--max-new-tokens", "8",
                 "--project", "none", "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "ngram" in text and "auto" in text and " model " not in text


# --- multi-turn conversations and the held-out set (issue 12) --------------------------------------
def test_multiturn_and_heldout_sets():
    mt = prompt_sets.load_prompts("multiturn")
    units = prompt_sets.prompt_units(mt)
    assert len(units) >= 3 and all(len(u) >= 3 for u in units)
    assert all(p.conversation for p in mt)
    ho = prompt_sets.load_prompts("heldout")
    assert len(ho) >= 8 and not any(p.conversation for p in ho)
    assert not {p.id for p in mt} & {p.id for p in ho}
    un = prompt_sets.load_prompts("unseen")
    assert len(un) == 16 and len({p.category for p in un}) == 7
    assert not {p.id for p in un} & ({p.id for p in ho} | {p.id for p in mt})


# --- the order the prompts run in (`--order`) --------------------------------------------------------
def _mixed_prompts():
    P = prompt_sets.Prompt
    return [P("a1", "A", "x"), P("b1", "B", "x"), P("t1", "A", "x", conversation="c"), P("a2", "A", "x"),
            P("t2", "A", "x", conversation="c"), P("b2", "B", "x")]


@pytest.mark.parametrize("order, ids", [
    ("file", ["a1", "b1", "t1", "t2", "a2", "b2"]),  # a conversation's turns run together, where it starts
    ("reverse", ["b2", "a2", "t1", "t2", "b1", "a1"]),  # units reversed, a conversation's turns still in order
    ("interleave", ["a1", "b1", "t1", "t2", "b2", "a2"]),  # A, B, A, B, then what is left of A
])
def test_order_prompts(order, ids):
    assert [p.id for p in prompt_sets.order_prompts(_mixed_prompts(), order)] == ids


def test_order_prompts_names_a_bad_order():
    with pytest.raises(InvalidRequest, match="--order 'sideways': must be one of file, reverse, interleave"):
        prompt_sets.order_prompts(_mixed_prompts(), "sideways")


def test_interleave_on_the_shipped_sets_takes_one_of_each_category_in_turn():
    ps = prompt_sets.order_prompts(prompt_sets.load_prompts("code,chat"), "interleave")
    cats = [p.category for p in ps]
    assert cats[:8] == ["write", "complete", "refactor", "explain", "summarise", "answer", "rewrite", "translate"]
    assert sorted(p.id for p in ps) == sorted(p.id for p in prompt_sets.load_prompts("code,chat"))


def test_bench_order_flag(tiny_bundle, tmp_path, capsys):
    """--order reaches the run: the prompts run (and are saved) reversed, and the header says so; a bad
    order is refused by the parser, and a saved run cannot be reordered."""
    out = tmp_path / "o.json"
    assert main(["bench", str(tiny_bundle), "--prompts", "code", "--limit", "2", "--order", "reverse", "--repeats", "1",
                 "--max-new-tokens", "6", "--modes", "target,ngram", "--project", "none", "--quiet",
                 "--json", str(out)]) == 0
    assert "code (2), reverse order |" in capsys.readouterr().out
    d = json.loads(out.read_text())
    first_two = [p.id for p in prompt_sets.load_prompts("code")[:2]]
    assert [p["id"] for p in d["prompts"]] == first_two[::-1]
    assert [s["prompt_id"] for s in d["samples"]][:2] == [first_two[1]] * 2 and d["meta"]["prompt_order"] == "reverse"
    with pytest.raises(SystemExit) as e:
        main(["bench", str(tiny_bundle), "--order", "sideways"])
    assert e.value.code == 2 and "invalid choice: 'sideways'" in capsys.readouterr().err
    assert main(["bench", str(out), "--order", "interleave"]) == 1
    assert "--order interleave: a saved run is reported in the order it ran" in capsys.readouterr().err


def test_a_conversation_turn_holds_the_earlier_turns_and_answers():
    p = prompt_sets.Prompt(id="t2", category="c", prompt="again, in German", conversation="x")
    hist = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert p.request(hist) == {"messages": [*hist, {"role": "user", "content": "again, in German"}]}


@pytest.mark.parametrize("line, message", [
    ('{"prompt": "x", "conversation": ""}', "'conversation' must be a non-empty string"),
    ('{"prompt": "x", "conversation": "c", "raw": true}', "'raw' cannot be used"),
])
def test_bad_conversation_lines(tmp_path, line, message):
    f = tmp_path / "p.jsonl"
    f.write_text(line + "\n")
    with pytest.raises(InvalidRequest, match=message):
        prompt_sets.load_prompts(str(f))


def test_conversation_turns_run_in_order_from_one_reset(tiny_bundle):
    """Each mode runs all turns of a conversation back to back, with one reset before the first:
    the second turn's request holds the first answer, and the suffix index still holds the first
    turn when the second runs (so a turn that repeats an answer can copy it)."""
    from edgespec.engine import Engine

    prompts = [prompt_sets.Prompt(id="c1", category="conv", prompt="def add(a, b):", conversation="c"),
               prompt_sets.Prompt(id="c2", category="conv", prompt="Repeat that.", conversation="c"),
               prompt_sets.Prompt(id="solo", category="solo", prompt="def mul(a, b):")]
    modes = bench.parse_modes("target,suffix,auto", None, has_draft=True)
    eng = Engine.open(tiny_bundle, draft="auto", max_len=512)
    resets = []
    orig = eng.reset_cache
    eng.reset_cache = lambda: (resets.append(len(eng.history)), orig())[1]
    try:
        run = bench.run_bench(eng, prompts, modes, max_new_tokens=16, repeats=1, warmup=False)
    finally:
        eng.close()
    order = [(s.prompt_id, s.mode) for s in run.samples]
    for m in ("target", "suffix", "auto"):
        assert order.index(("c1", m)) + 1 == order.index(("c2", m))
    # one before the modes' lineages are made, then one before and one after each (unit, mode): not per turn
    assert len(resets) == 1 + 2 * 2 * 3
    c1 = {s.mode: s for s in run.samples if s.prompt_id == "c1"}
    c2 = {s.mode: s for s in run.samples if s.prompt_id == "c2"}
    for m in c2:
        assert c2[m].prompt_tokens > c1[m].prompt_tokens + c1[m].new_tokens  # history included
        assert c2[m].same_as_target in (None, True)
    assert "suffix" in bench_report.report_text(run)


def test_the_warmup_teaches_no_mode(tiny_bundle, monkeypatch):
    """The warmup runs every mode for 8 tokens on the first prompt to pay one-off costs; what the
    drafters learn there must not reach the measured runs. It did: the warmup's `model` run took the
    draft's estimates in an engine, so `auto` in the bench did not start where a server's `auto` would."""
    from edgespec.engine import Engine

    eng = Engine.open(tiny_bundle, draft="auto", max_len=512)  # its warmup built the slot's draft drafter
    model = eng.slot_drafters(0)["model"]
    prior = model.mean.a + model.mean.b
    # the draft drafts every round: whether it pays on the tiny model is the machine's timing (drafters/model.py)
    monkeypatch.setattr(model, "pays", lambda k: True)

    def verdicts() -> float:  # tokens of evidence the draft's acceptance has seen beyond its prior
        return round(model.mean.a + model.mean.b - prior, 6)

    assert verdicts() == 0
    warmed, seen = [], []
    warm, one = bench._warm, bench._one
    monkeypatch.setattr(bench, "_warm", lambda *a: (warm(*a), warmed.append(verdicts())))

    def first_round_state(engine, p, mode, *a, **kw):
        seen.append((mode.label, verdicts()))
        return one(engine, p, mode, *a, **kw)

    monkeypatch.setattr(bench, "_one", first_round_state)
    prompts = [prompt_sets.Prompt(id="p", category="c", prompt="def add(a, b):")]
    try:
        bench.run_bench(eng, prompts, bench.parse_modes("target,model,auto", None, has_draft=True),
                        max_new_tokens=8, repeats=1, warmup=True)
    finally:
        eng.close()
    assert warmed[0] > 0  # the warmup's `model` run drafted ...
    assert seen == [("target", 0), ("model", 0), ("auto", 0)]  # ... and every mode starts from before it


def test_each_mode_learns_as_if_it_ran_alone():
    """A finished request's estimates seed the next request's drafters of the same modes, whatever mode
    ran it (engine/batch_drafters.py): what one mode's generations taught must not be there when another
    mode runs, and comes back when its own mode runs again."""
    from edgespec.bench.lineage import Lineages
    from edgespec.core.costmodel import CostModel
    from edgespec.drafters.auto import REPLY_KEEP, REPLY_PRIOR
    from edgespec.engine.batch_drafters import BatchDrafters
    from helpers.costs import times

    bd = BatchDrafters(suffix_capacity=256, max_len=256)
    engine = types.SimpleNamespace(drafter_state=bd.state, load_drafter_state=bd.load_state)
    costs, prompt = CostModel(times(s1=0.1)), list(range(10))

    def finish(mode: str, reply: int) -> None:
        d, _, _ = bd.for_request(mode, None, costs)
        d.begin(prompt)
        bd.finished(d, prompt + [7] * reply)

    def auto_reply() -> float:  # the mean reply length the next auto request starts from
        return bd.for_request("auto", None, costs)[0].reply

    lines = Lineages(engine, lambda e: None)
    lines.enter("auto")
    finish("auto", 40)
    assert auto_reply() == pytest.approx(REPLY_KEEP * REPLY_PRIOR + (1 - REPLY_KEEP) * 40)
    lines.leave("auto")
    lines.enter("suffix")
    assert auto_reply() == REPLY_PRIOR  # the engine's start, not auto's run
    finish("suffix", 12)
    lines.leave("suffix")
    lines.enter("auto")
    assert auto_reply() == pytest.approx(REPLY_KEEP * REPLY_PRIOR + (1 - REPLY_KEEP) * 40)  # its own, back
