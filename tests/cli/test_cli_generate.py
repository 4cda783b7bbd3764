"""`edgespec generate` and `edgespec chat` as a user runs them (in-process, through cli.main)."""
from __future__ import annotations

import io
import json

import pytest

from edgespec import Engine
from edgespec.cli.main import main
from edgespec.edge.providers import CPU


def run_cli(capsys, *argv, stdin: str | None = None, monkeypatch=None):
    if stdin is not None:
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("draft", ["auto", "model", "ngram", "none"])
def test_generate_streams_text_and_prints_stats(tiny_bundle, capsys, draft):
    ref = Engine.open(tiny_bundle).generate("def add(a, b):", max_new_tokens=20, draft="none")
    rc, out, err = run_cli(capsys, "generate", str(tiny_bundle), "-p", "def add(a, b):", "--max-new-tokens", "20",
                           "--draft", draft)
    assert rc == 0
    assert out == ref.text + "\n"
    assert "tok/s" in err and "TTFT" in err and f"drafter {draft}" in err and "finish" in err


def test_generate_tree_on_gives_the_target_alone_text_and_reports_the_trees(tiny_bundle, capsys):
    prompt = "one two three one two four one two three one two"
    ref = Engine.open(tiny_bundle).generate(prompt, max_new_tokens=30, draft="none")
    rc, out, err = run_cli(capsys, "generate", str(tiny_bundle), "-p", prompt, "--max-new-tokens", "30",
                           "--draft", "auto", "--tree", "on", "--k", "4")
    assert rc == 0 and out == ref.text + "\n"
    assert "tree rounds" in err and "accepted depth" in err


def test_generate_unknown_tree_mode(tiny_bundle, capsys):
    with pytest.raises(SystemExit):
        run_cli(capsys, "generate", str(tiny_bundle), "-p", "x", "--tree", "wide")
    assert "invalid choice: 'wide'" in capsys.readouterr().err


def test_generate_json(tiny_bundle, capsys):
    rc, out, _ = run_cli(capsys, "generate", str(tiny_bundle), "-p", "hello", "--chat", "--json",
                         "--max-new-tokens", "9", "--temperature", "0.7", "--top-p", "0.9", "--top-k", "50",
                         "--seed", "1", "--draft", "model", "--k", "3")
    assert rc == 0
    d = json.loads(out)
    assert set(d) >= {"text", "finish_reason", "token_ids", "stats", "model"}
    s = d["stats"]
    for key in ("prompt_tokens", "new_tokens", "target_passes", "drafted", "accepted", "acceptance_rate",
                "tokens_per_pass", "ttft_s", "decode_tokens_per_second", "tokens_per_second", "k_mean"):
        assert key in s
    assert s["new_tokens"] == len(d["token_ids"]) <= 9 and s["drafter"] == "model"


def test_generate_prompt_from_stdin_and_stop(tiny_bundle, capsys, monkeypatch):
    ref = Engine.open(tiny_bundle).generate("def add(a, b):", max_new_tokens=30, draft="none")
    stop = ref.text[8:11]
    assert len(stop) == 3
    rc, out, err = run_cli(capsys, "generate", str(tiny_bundle), "-p", "-", "--max-new-tokens", "30",
                           f"--stop={stop}", stdin="def add(a, b):", monkeypatch=monkeypatch)
    assert rc == 0 and out == ref.text[: ref.text.find(stop)] + "\n" and "finish stop" in err


@pytest.mark.parametrize("args,needle", [
    (["--temperature", "-1"], "temperature"),
    (["--top-p", "0"], "top_p"),
    (["--top-p", "1.5"], "top_p"),
    (["--max-new-tokens", "0"], "max_new_tokens"),
    (["--k", "0"], "k must be"),
])
def test_generate_bad_input_is_one_clear_line(tiny_bundle, capsys, args, needle):
    rc, out, err = run_cli(capsys, "generate", str(tiny_bundle), "-p", "x", *args)
    assert rc == 1 and out == ""
    lines = err.strip().splitlines()
    assert lines[-1].startswith("edgespec generate: error:") and needle in lines[-1]


def test_generate_empty_prompt(tiny_bundle, capsys):
    rc, _, err = run_cli(capsys, "generate", str(tiny_bundle), "-p", "")
    assert rc == 1 and "prompt is empty" in err


def test_generate_draft_model_without_draft(tiny_bundle_nodraft, capsys):
    rc, _, err = run_cli(capsys, "generate", str(tiny_bundle_nodraft), "-p", "x", "--draft", "model")
    assert rc == 1 and "no draft model" in err


def test_generate_unknown_drafter_is_refused_by_the_parser(tiny_bundle, capsys):
    with pytest.raises(SystemExit) as e:
        main(["generate", str(tiny_bundle), "-p", "x", "--draft", "magic"])
    assert e.value.code == 2
    assert "invalid choice: 'magic'" in capsys.readouterr().err


def test_generate_prompt_too_long(tiny_bundle, capsys):
    rc, _, err = run_cli(capsys, "generate", str(tiny_bundle), "-p", "def add(a, b): return a + b\n" * 20,
                         "--max-len", "32")
    assert rc == 1 and "cache holds 32" in err


def test_generate_missing_bundle(tmp_path, capsys):
    rc, _, err = run_cli(capsys, "generate", str(tmp_path / "nope"), "-p", "x")
    assert rc == 1 and "does not exist" in err


def test_chat_keeps_the_conversation_cache(tiny_bundle, capsys, monkeypatch):
    rc, out, err = run_cli(capsys, "chat", str(tiny_bundle), "--max-new-tokens", "12", "--system", "be brief",
                           stdin="def add(a, b):\n\nclass Stack:\n/reset\nclass Stack:\n/exit\nnever sent\n",
                           monkeypatch=monkeypatch)
    assert rc == 0
    stats = [line for line in err.splitlines() if line.startswith("[")]
    assert len(stats) == 3
    assert "reused" not in stats[0]
    assert "reused" in stats[1]  # the second turn prefilled only the new text
    assert "(new conversation)" in err
    # after /reset the same first message gives the same reply as a fresh engine
    eng = Engine.open(tiny_bundle)
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "class Stack:"}]
    assert out.splitlines()[-1] == eng.generate(messages=msgs, max_new_tokens=12).text.splitlines()[-1]


def test_chat_reports_an_overlong_conversation_and_goes_on(tiny_bundle, capsys, monkeypatch):
    long = "def add(a, b): return a + b " * 10
    rc, out, err = run_cli(capsys, "chat", str(tiny_bundle), "--max-len", "48", "--max-new-tokens", "4",
                           stdin=f"{long}\nhi\n", monkeypatch=monkeypatch)
    assert rc == 0
    assert "error: prompt is" in err and "/reset" in err
    assert len([line for line in err.splitlines() if line.startswith("[")]) == 1


# --- the edge options (device, providers, budgets), the same on generate, chat and serve ---------
@pytest.mark.parametrize("args,needle", [
    (["--device", "orin-nanoo"], "known devices"),
    (["--providers", "gpu"], "unknown execution provider 'gpu'"),
    (["--draft-providers", "gpu"], "draft providers: unknown execution provider 'gpu'"),
    (["--threads", "0"], "threads must be an integer from 1"),
    (["--memory-budget", "lots"], "not a memory size: 'lots'"),
    (["--memory-budget", "1KiB"], "memory budget 1 KiB is too small"),
    (["--power-budget", "hot"], "not a power budget like 10W: 'hot'"),
    (["--power-budget", "0W"], "power budget must be positive"),
    (["--max-temp", "500C"], "outside 0-150 C"),
])
@pytest.mark.parametrize("command", ["generate", "chat"])
def test_edge_options_bad_values_are_one_clear_line(tiny_bundle, capsys, monkeypatch, command, args, needle):
    extra = ["-p", "x"] if command == "generate" else []
    rc, out, err = run_cli(capsys, command, str(tiny_bundle), *extra, *args, stdin="hi\n", monkeypatch=monkeypatch)
    assert rc == 1 and out == ""
    lines = err.strip().splitlines()
    assert lines[-1].startswith(f"edgespec {command}: error:") and needle in lines[-1], lines[-1]


def test_generate_edge_options_reach_the_engine(tiny_bundle, capsys, monkeypatch):
    """Every edge option reaches the engine's settings, parsed once; --device defaults to auto (this
    board's defaults)."""
    seen = settings_spy(monkeypatch)
    rc, out, err = run_cli(capsys, "generate", str(tiny_bundle), "-p", "def add(a, b):", "--max-new-tokens", "8",
                           "--draft", "model", "--providers", "cpu", "--draft-providers", "cpu", "--threads", "2",
                           "--memory-budget", "2GiB", "--power-budget", "10W", "--max-temp", "80C")
    assert rc == 0, err
    s = seen["settings"]
    assert (s.draft, s.providers, s.draft_providers, s.threads, s.memory_budget, s.power_budget_w, s.max_temp_c,
            s.device) == ("model", (CPU,), (CPU,), 2, 2 << 30, 10.0, 80.0, "auto")
    rc, _, err = run_cli(capsys, "generate", str(tiny_bundle), "-p", "x", "--max-new-tokens", "2",
                         "--device", "generic-x86_64")
    assert rc == 0 and seen["settings"].device == "generic-x86_64"


def settings_spy(monkeypatch) -> dict:
    """Records the Settings each Engine is built from (the real engine is still built)."""
    seen: dict = {}
    real = Engine.from_plan.__func__

    def spy(cls, plan):
        seen["settings"] = plan.settings
        return real(cls, plan)

    monkeypatch.setattr(Engine, "from_plan", classmethod(spy))
    return seen


def test_generate_with_draft_on_the_cpu_is_lossless(tiny_bundle, capsys):
    ref = Engine.open(tiny_bundle).generate("def add(a, b):", max_new_tokens=20, draft="none")
    rc, out, err = run_cli(capsys, "generate", str(tiny_bundle), "-p", "def add(a, b):", "--max-new-tokens", "20",
                           "--draft", "model", "--draft-providers", "cpu", "--providers", "cpu")
    assert rc == 0 and out == ref.text + "\n"


def test_serve_takes_the_same_edge_options_and_defaults_to_this_board(tiny_bundle, monkeypatch):
    """serve passes what was given (options or EDGESPEC_* variables) and --device auto otherwise."""
    import edgespec.server.service as service_mod

    opened = {}

    class FakeService:
        def __init__(self, config, open_engine, default_name):
            self.open_engine = open_engine

        def run(self):
            opened["engine"] = self.open_engine()
            opened["engine"].close()
            return 0

    seen = settings_spy(monkeypatch)
    monkeypatch.setattr(service_mod, "Service", FakeService)
    for name in ("EDGESPEC_DEVICE", "EDGESPEC_PROVIDERS", "EDGESPEC_DRAFT_PROVIDERS", "EDGESPEC_THREADS"):
        monkeypatch.delenv(name, raising=False)
    assert main(["serve", str(tiny_bundle), "--draft-providers", "cpu", "--threads", "2", "--no-warmup"]) == 0
    s = seen["settings"]
    assert (s.device, s.draft_providers, s.threads) == ("auto", (CPU,), 2)
    monkeypatch.setenv("EDGESPEC_DEVICE", "generic-x86_64")
    assert main(["serve", str(tiny_bundle), "--no-warmup"]) == 0
    assert seen["settings"].device == "generic-x86_64"


def test_generate_suffix_capacity(tiny_bundle, capsys):
    """--suffix-capacity reaches the engine: a small index still drafts losslessly; a bad one is one line."""
    ref = Engine.open(tiny_bundle).generate("a b c a b c a b", max_new_tokens=16, draft="none")
    rc, out, err = run_cli(capsys, "generate", str(tiny_bundle), "-p", "a b c a b c a b", "--max-new-tokens", "16",
                           "--draft", "suffix", "--suffix-capacity", "64")
    assert rc == 0 and out == ref.text + "\n"
    rc, _, err = run_cli(capsys, "generate", str(tiny_bundle), "-p", "x", "--suffix-capacity", "8")
    assert rc == 1 and "suffix index capacity must be an integer >= 16 tokens, got 8" in err


SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "tag": {"enum": ["a", "b"]}}, "required": ["n", "tag"],
          "additionalProperties": False}


def test_generate_with_a_json_schema_or_grammar_file(tiny_bundle, capsys, tmp_path):
    schema = tmp_path / "report.json"
    schema.write_text(json.dumps(SCHEMA))
    ref = Engine.open(tiny_bundle).generate("x", max_new_tokens=30, draft="none", json_schema=SCHEMA)
    rc, out, _ = run_cli(capsys, "generate", str(tiny_bundle), "-p", "x", "--max-new-tokens", "30",
                         "--json-schema", str(schema))
    assert rc == 0 and out == ref.text + "\n"
    if ref.finish_reason == "stop":
        assert set(json.loads(ref.text)) == {"n", "tag"}
    lark = tmp_path / "cmd.lark"
    lark.write_text('start: "on" | "off"\n')
    rc, out, _ = run_cli(capsys, "generate", str(tiny_bundle), "-p", "x", "--grammar", str(lark))
    assert rc == 0 and out in ("on\n", "off\n")


@pytest.mark.parametrize("flag, content, needle", [
    ("--json-schema", None, "cannot be read"),
    ("--json-schema", "{not json", "not valid JSON"),
    ("--json-schema", '{"type": "strin"}', "refused by the grammar compiler"),
    ("--grammar", "start: nope", "refused by the grammar compiler"),
])
def test_a_bad_schema_or_grammar_file_is_exit_1_naming_it(tiny_bundle, capsys, tmp_path, flag, content, needle):
    path = tmp_path / "bad.txt"
    if content is not None:
        path.write_text(content)
    rc, out, err = run_cli(capsys, "generate", str(tiny_bundle), "-p", "x", flag, str(path))
    assert rc == 1 and out == ""
    last = err.strip().splitlines()[-1]
    assert last.startswith("edgespec generate: error:") and f"{flag} {path}" in last and needle in last
