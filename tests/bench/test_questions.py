"""`bench --questions`: the venue question files, fact matching, declines, the report's numbers on a fake
asker, and the command on a tiny bundle (plain and by-hand conditions)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from edgespec.bench import questions as qs
from edgespec.errors import InvalidRequest

VENUES = Path(__file__).resolve().parents[1] / "data" / "venues"


@pytest.mark.parametrize("venue", ["museum", "heldout-station"])
def test_the_venue_sets_are_well_formed(venue):
    """Checks the files' shape only (never their content: nobody tunes on the held-out one)."""
    qq = qs.load_questions(VENUES / venue / "questions.jsonl")
    pages = VENUES / venue / "pages"
    assert len(qq) == 30 and len(list(pages.iterdir())) == 12
    assert {q.kind for q in qq} == set(qs.KINDS)
    assert sum(not q.answerable for q in qq) == 6
    qs.check_venue(qq, pages, ["by-hand"])  # every page a question names is there
    for p in pages.iterdir():
        assert 150 <= len(p.read_text(encoding="utf-8").split()) <= 400, p.name


@pytest.mark.parametrize("answer, fact, held", [
    ("An adult ticket costs £12.00.", ("£12", "12.00"), True),
    ("It costs £112.00", ("12.00",), False),  # not inside a longer number
    ("Closes at 4:30 PM", ("16:30", "4:30"), True),
    ("the  MARGARET\\nANN".replace("\\n", "\n"), ("margaret ann",), True),
    ("It is 130 steps", ("30",), False),
    ("Bus 7, every 20 minutes", ("bus 7",), True),
])
def test_facts_are_found_by_spelling_not_inside_other_numbers(answer, fact, held):
    assert qs.holds(answer, fact) is held


def test_declines_are_recognised():
    assert qs.is_decline("I can't find that in this venue's documents, so I won't guess.")
    assert qs.is_decline("The pages do not say who the director is.")
    assert not qs.is_decline("The museum opens at 09:30.")


@pytest.mark.parametrize("line, match", [
    ("not json", r"q.jsonl line 1: not JSON"),
    ('{"id": "a", "question": "q?", "kind": "guess", "expect": []}', r"kind 'guess' is not one of"),
    ('{"id": "a", "question": "q?", "expect": "12"}', r"'expect' must be a list of facts"),
    ('{"id": "a", "question": "q?", "kind": "lookup", "expect": []}', r"an unanswerable question has expect \[\]"),
    ('{"id": "a", "question": "", "expect": [["x"]]}', r"'question' must be a non-empty string"),
    ('{"id": "a", "question": "q?", "expect": [["x"]], "pages": "p.md"}', r"'pages' must be a list of file names"),
])
def test_bad_question_files_are_one_line_with_the_line_number(tmp_path, line, match):
    f = tmp_path / "q.jsonl"
    f.write_text(line + "\n")
    with pytest.raises(InvalidRequest, match=match):
        qs.load_questions(f)


def test_a_repeated_id_and_an_empty_file(tmp_path):
    f = tmp_path / "q.jsonl"
    f.write_text('{"id": "a", "question": "q?", "expect": [["x"]]}\n' * 2)
    with pytest.raises(InvalidRequest, match=r"q.jsonl line 2: id 'a' appears twice"):
        qs.load_questions(f)
    f.write_text("\n")
    with pytest.raises(InvalidRequest, match=r"no questions"):
        qs.load_questions(f)


@dataclass
class Stats:
    new_tokens: int
    ttft_s: float
    total_s: float
    decode_tokens_per_second: float = 0.0
    accepted_by_source: dict | None = None


class FakeAsker:
    """Knows the museum's adult price only from the pages; 'auto' decodes twice as fast and takes 3 tokens from
    the documents; with docs, retrieval declines the Wi-Fi question and cites tickets.html otherwise."""

    def __init__(self):
        self.asked = []

    def ask(self, messages, *, draft, docs, max_new_tokens):
        content = messages[-1]["content"]
        self.asked.append((draft, docs, content))
        fast = draft == "auto"
        stats = Stats(new_tokens=11, ttft_s=0.5, total_s=0.5 + (1.0 if fast else 2.0),
                      accepted_by_source={"docs": 3} if fast else {})
        if docs and "Wi-Fi" in content:
            return qs.Answer("I can't find that.", Stats(5, 0.01, 0.01), [], True)
        if "adult" in content and ("£12.00" in content or docs):
            return qs.Answer("An adult ticket costs £12.00.", stats, ["/venue/tickets.html"] if docs else [], False if docs else None)
        return qs.Answer("It is probably £15.", stats, [], False if docs else None)


def test_the_report_counts_facts_declines_recall_and_speed():
    questions = [q for q in qs.load_questions(VENUES / "museum" / "questions.jsonl") if q.id in ("m01", "m25")]
    asker = FakeAsker()
    samples = qs.run_questions(asker, questions, ["plain", "by-hand", "docs"], ["target", "auto"],
                               venue=VENUES / "museum" / "pages")
    assert len(samples) == 2 * 3 * 2
    by_hand_prompt = next(c for d, docs, c in asker.asked if "--- tickets.html ---" in c)
    assert by_hand_prompt.startswith(qs.BY_HAND) and by_hand_prompt.endswith("Question: How much is an adult day ticket?")
    rows = {(r.condition, r.mode): r for r in qs.summarize(samples)}
    assert (rows["plain", "target"].facts_held, rows["plain", "target"].answered) == (0, 1)
    assert rows["by-hand", "target"].facts_held == 1 and rows["by-hand", "target"].declined == 0
    docs = rows["docs", "auto"]
    assert (docs.facts_held, docs.declined, docs.unanswerable, docs.recall) == (1, 1, 1, 1.0)
    assert docs.speedup == pytest.approx(2.0) and docs.docs_tokens == 3 and docs.same_as_target == 2
    # the median wait of the turns the model answered: the declined one (0.01 s) would halve it
    assert rows["docs", "target"].ttft_median_s == pytest.approx(0.5)
    assert rows["plain", "target"].ttft_median_s == pytest.approx(0.5)
    assert rows["docs", "target"].tokens_per_s == pytest.approx(10 / 2.0)  # the declined one wrote nothing
    text = qs.report_text(list(rows.values()), {"questions": "q.jsonl", "n": 2, "max_new_tokens": 64, "load": "1.0"})
    assert "1/1 (100 %)" in text and "2.00x" in text


def test_a_condition_may_name_its_own_modes():
    questions = qs.load_questions(VENUES / "museum" / "questions.jsonl")[:3]
    conds, own = qs.parse_conditions("plain:target,docs", ["target", "auto"], docs=True)
    assert conds == ["plain", "docs"] and own == {"plain": ["target"]}
    samples = qs.run_questions(FakeAsker(), questions, conds, ["target", "auto"], condition_modes=own)
    assert [(s.condition, s.mode) for s in samples[:3]] == [("plain", "target"), ("docs", "target"), ("docs", "auto")]
    assert len(samples) == 3 * 3


class _Docs:
    """Retrieval that quotes one fixed passage (or declines questions that say so)."""

    in_cache = False  # passages quoted per turn: nothing for the asker to pin

    def turn(self, messages):
        q = messages[-1]["content"]
        quoted = [{"role": "user", "content": "PASSAGES " + q}]
        return type("T", (), {"declined": "decline" in q, "messages": quoted})()


class _Engine:
    """What EngineAsker calls: prompts encode to their characters' codes; hold and generate are recorded."""

    def __init__(self):
        self.docs = _Docs()
        self.seen, self.held, self.resets = [], [], 0

    def reset_cache(self):
        self.resets += 1

    def encode(self, messages):
        return [ord(c) for c in messages[-1]["content"]]

    def hold(self, tokens):
        self.held.append("".join(map(chr, tokens)))

    def generate(self, messages, **kw):
        self.seen.append(self.docs)
        return type("R", (), {"text": "x", "stats": Stats(2, 0.1, 0.2), "docs": None})()


def test_plain_and_by_hand_set_the_documents_aside_for_the_call():
    e = _Engine()
    kn = e.docs
    asker = qs.EngineAsker(e)
    asker.ask([{"role": "user", "content": "q"}], draft="none", docs=False, max_new_tokens=4)
    asker.ask([{"role": "user", "content": "q"}], draft="none", docs=True, max_new_tokens=4)
    assert e.seen == [None, kn] and e.docs is kn and e.resets == 2
    e.docs = None
    with pytest.raises(InvalidRequest, match="needs --docs INDEX"):
        asker.ask([{"role": "user", "content": "q"}], draft="none", docs=True, max_new_tokens=4)


def test_each_question_starts_with_what_it_shares_with_the_one_before_cached():
    """A kiosk's cache holds the previous visitor's prompt: its head (system prompt, the template's
    instructions) is reused, nothing of this question. Every mode of a question starts alike."""
    e = _Engine()
    asker = qs.EngineAsker(e)
    ask = lambda q, docs: asker.ask([{"role": "user", "content": q}], draft="none", docs=docs, max_new_tokens=4)
    ask("Q: when open?", True)
    ask("Q: when open?", True)  # the second mode of the first question: nothing before it
    assert e.held == [] and e.resets == 2
    ask("Q: what price?", True)
    ask("Q: what price?", True)  # the second mode of the same question holds the same head, not its own prompt
    assert e.held == ["PASSAGES Q: wh", "PASSAGES Q: wh"]
    ask("Q: where?", False)  # conditions keep their own previous question: the first plain one has none
    ask("decline this", True)  # a turn retrieval declines runs no model: nothing held
    assert e.held == ["PASSAGES Q: wh", "PASSAGES Q: wh"] and e.resets == 6


def test_the_command_runs_plain_and_by_hand_on_a_tiny_bundle(tiny_bundle, tmp_path, capsys):
    from edgespec.cli.main import main

    (tmp_path / "pages").mkdir()  # a venue that fits the tiny bundle's 512-token cache
    (tmp_path / "pages" / "tickets.md").write_text("# Tickets\n\nAn adult ticket costs 12 euros.\n")
    (tmp_path / "q.jsonl").write_text(
        '{"id": "a", "question": "How much is a ticket?", "pages": ["tickets.md"], "expect": [["12"]]}\n'
        '{"id": "b", "question": "Wi-Fi?", "kind": "unanswerable", "pages": ["tickets.md"], "expect": []}\n')
    out = tmp_path / "q.json"
    rc = main(["bench", str(tiny_bundle), "--questions", str(tmp_path / "q.jsonl"), "--venue", str(tmp_path / "pages"),
               "--modes", "target,ngram", "--max-new-tokens", "4", "--quiet", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0 and "by-hand" in text and "plain" in text
    d = json.loads(out.read_text())
    assert [(r["condition"], r["mode"]) for r in d["rows"]] == [("plain", "target"), ("plain", "ngram"),
                                                               ("by-hand", "target"), ("by-hand", "ngram")]
    assert all(r["same_as_target"] == 2 for r in d["rows"] if r["mode"] == "ngram")  # lossless, greedy


@pytest.mark.parametrize("argv, match", [
    (["--questions", "Q", "--conditions", "docs"], "--conditions docs needs --docs INDEX"),
    (["--questions", "Q", "--conditions", "guess"], "--conditions: 'guess' is not one of plain, by-hand, docs"),
    (["--questions", "Q", "--conditions", "plain:target+psychic"], "--conditions plain:target\\+psychic: unknown mode"),
    (["--questions", "Q"], "--conditions by-hand needs --venue"),
    (["--docs", "somewhere"], "--docs, --venue and --conditions go with --questions"),
    (["--questions", "Q", "--conditions", "plain", "--modes", "target,psychic"], "unknown mode\\(s\\) \\['psychic'\\]"),
])
def test_bad_question_bench_arguments_are_one_line(argv, match, capsys):
    from edgespec.cli.main import main

    argv = [str(VENUES / "museum" / "questions.jsonl") if a == "Q" else a for a in argv]
    assert main(["bench", "nowhere-bundle", *argv]) == 1
    err = capsys.readouterr().err.strip()
    assert __import__("re").search(match, err) and len(err.splitlines()) == 1, err
