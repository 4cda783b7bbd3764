"""The cached reading (engine/venue_rows.py): every passage's rows computed once at positions of their own,
copied in after the pinned base for a visitor's turn, which then prefills only its question. Checked on
the tiny model: rows placed from elsewhere are the rows a step computes there; a turn prefills only the
question and every drafter writes what the target alone writes from that cache; the second visitor's
other passages and the first's again give the first's answer; follow-ups and other system prompts are
quoted as before; a reload recomputes; a saved file is reused, and a corrupt one recomputed. At
--parallel 3 (batch.py) three turns at once copy their passages as the serial engine's turn does and
answer as it does, also in slots other requests overwrote; turns that do not qualify are quoted; a
reload while a request runs re-pins the free slots."""
from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np
import pytest

from edgespec.core.runner import CacheFull
from edgespec.engine import Engine
from edgespec.engine.pinned import pin_system_prompt
from edgespec.docs import answer
from edgespec.docs.answer import tokenizer_sha256
from edgespec.docs.index import build_index

from helpers.batch import generate_all

SYSTEM = "Kiosk."
PAGES = {"tickets.md": "# Tickets\n\nA family ticket costs 35 euros.\n",
         "hours.md": "# Hours\n\nOpen daily from 10 to 6.\n",
         "cafe.md": "# Cafe\n\nThe cafe sells soup.\n"}


def _index(tiny_bundle, pages, out, **kw):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tiny_bundle / "tokenizer.json"))
    build_index([pages], out, tok, tokenizer_sha256(tiny_bundle), **kw)


@contextlib.contextmanager
def _tiny_venue(tmp_path_factory):
    """The tiny model reads 512 positions: a three-page venue (its index path), short templates (its
    tokenizer spells most words letter by letter), a small turn room; the patches last the block."""
    pages = tmp_path_factory.mktemp("pages")
    for name, text in PAGES.items():
        (pages / name).write_text(text)
    out = tmp_path_factory.mktemp("venue") / "venue.idx"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(answer, "TURN_ROOM", 64)
        mp.setattr(answer, "PREAMBLE", "Passages:")
        mp.setattr(answer, "DEFAULT_SYSTEM", SYSTEM)
        from edgespec.engine import venue_rows

        mp.setattr(venue_rows, "PREAMBLE", "Passages:")
        yield pages, out


@pytest.fixture(scope="module")
def cached_engine(tiny_bundle, tmp_path_factory):
    with _tiny_venue(tmp_path_factory) as (pages, out):
        _index(tiny_bundle, pages, out, cached=True)
        eng = Engine.open(tiny_bundle, docs=str(out), warmup=False, draft="auto")
        eng.test_pages = pages
        eng.test_save = tmp_path_factory.mktemp("pinned")
        pin_system_prompt(eng, None, save_dir=eng.test_save)
        yield eng
        eng.close()


def _ask(eng, question, **kw):
    kw.setdefault("draft", "none")
    return eng.generate(messages=[{"role": "user", "content": question}], max_new_tokens=kw.pop("n", 8), **kw)


def _turns(questions, n=8, **kw):
    """BatchEngine.submit's arguments for single-question turns (helpers.batch.generate_all)."""
    return [{"messages": [{"role": "user", "content": q}], "max_new_tokens": n, **kw} for q in questions]


# -- the runner -----------------------------------------------------------------------------------------
def test_rows_computed_at_a_position_and_placed_are_the_rows_of_a_step_there(tiny_bundle):
    from edgespec.engine import build
    from edgespec.models.bundle import Bundle

    b = Bundle.open(tiny_bundle)
    a = build.load_runner(b.model_path("target"), b.target, 128)
    c = build.load_runner(b.model_path("target"), b.target, 128)
    base, block, question = [5, 6, 7, 8], [20, 21, 22, 23, 24], [30, 31]
    a.step(base)
    a.step(block, position=40)  # rows 4..8 at positions 40..44
    want = a.step(question, 2).copy()  # positions 45, 46 follow the last row's
    kv, pos = a.rows(4, 9)
    assert pos.tolist() == [40, 41, 42, 43, 44]
    c.step(base)
    c.place(kv, pos)
    assert c.length == 9
    np.testing.assert_array_equal(c.step(question, 2), want)
    # the same block at its own rows' positions (4..8) is another context: the positions are what moved
    c.rewind(4)
    c.step(block)
    assert not np.allclose(c.step(question, 2), want, atol=1e-4)
    # a reset forgets the positions; rows that are not this cache's are refused, and a full cache too
    c.reset()
    c.step(base + block + question)
    with pytest.raises(ValueError, match="is not"):
        c.place([r[:, :, :, :2] for r in kv], pos)
    c.reset()
    c.step([3] * 125)
    with pytest.raises(CacheFull):
        c.place(kv, pos)


# -- the engine -----------------------------------------------------------------------------------------
def test_a_turn_prefills_only_its_question_and_answers_as_every_drafter_does(cached_engine):
    eng = cached_engine
    rows = eng.venue_rows
    assert rows is not None and len(rows.rows) == 3 and eng.pinned.tokens == rows.base
    r = _ask(eng, "How much is a family ticket?")
    assert r.docs["sources"][0]["file"].endswith("tickets.md")
    blocks = [s["id"] - 1 for s in r.docs["sources"]]
    placed = sum(len(rows.blocks[c]) for c in blocks)
    q = rows.encode("Question: How much is a family ticket?")
    assert r.stats.prompt_tokens == len(rows.base) + placed + len(q) + len(rows.tail)
    assert r.stats.prompt_tokens - r.stats.cached_tokens == len(q) + len(rows.tail)  # the question alone
    for draft in ("suffix", "model", "ngram"):  # lossless from the assembled cache
        assert _ask(eng, "How much is a family ticket?", draft=draft, k=3).token_ids == r.token_ids, draft


def test_another_visitor_s_passages_then_the_first_again_give_the_first_answer(cached_engine):
    eng = cached_engine
    first = _ask(eng, "How much is a family ticket?")
    other = _ask(eng, "Does the cafe sell soup?")
    assert other.docs["sources"][0]["file"].endswith("cafe.md")
    eng.generate("unrelated text that overwrites the cache", max_new_tokens=2)
    again = _ask(eng, "How much is a family ticket?")
    assert again.token_ids == first.token_ids
    eng.reset_cache()  # from nothing: the base restored, every block copied
    assert _ask(eng, "How much is a family ticket?").token_ids == first.token_ids


def test_a_follow_up_and_another_system_prompt_are_quoted_and_prefilled(cached_engine):
    eng = cached_engine
    n_base = len(eng.venue_rows.base)
    follow = [{"role": "user", "content": "How much is a family ticket?"}, {"role": "assistant", "content": "35."},
              {"role": "user", "content": "and the cafe?"}]
    r = eng.generate(messages=follow, max_new_tokens=4)
    assert r.docs["sources"] and r.stats.prompt_tokens - r.stats.cached_tokens > 40  # its passages prefilled
    other = eng.generate(messages=[{"role": "system", "content": "Another kiosk."},
                                   {"role": "user", "content": "How much is a family ticket?"}], max_new_tokens=4)
    assert other.stats.cached_tokens < n_base and other.docs["sources"]


def test_a_restart_copies_the_saved_rows_and_a_corrupt_file_is_recomputed(cached_engine, caplog):
    eng = cached_engine
    want = _ask(eng, "How much is a family ticket?").token_ids
    saved = sorted(eng.test_save.glob("venue-*.npz"))
    assert len(saved) == 1
    caplog.set_level("INFO", logger="edgespec.engine")
    eng.venue_rows, eng.pinned = None, None
    pin_system_prompt(eng, None, save_dir=eng.test_save)
    assert "(file)" in caplog.text and _ask(eng, "How much is a family ticket?").token_ids == want
    data = bytearray(saved[0].read_bytes())
    data[len(data) // 2] ^= 0xFF
    saved[0].write_bytes(bytes(data))
    caplog.clear()
    eng.venue_rows, eng.pinned = None, None
    pin_system_prompt(eng, None, save_dir=eng.test_save)
    assert "ignoring" in caplog.text and "(computed)" in caplog.text
    assert _ask(eng, "How much is a family ticket?").token_ids == want


def test_a_reload_with_new_pages_recomputes_and_never_reads_old_rows(cached_engine, tmp_path):
    eng = cached_engine
    kn = eng.docs
    old = eng.venue_rows
    (tmp_path / "shop.md").write_text("# Shop\n\nIt sells postcards.\n")
    for name, text in PAGES.items():
        (tmp_path / name).write_text(text)
    _index(eng.bundle.root, tmp_path, kn.path, cached=True)
    try:
        before = eng.prepare(messages=[{"role": "user", "content": "How much is a family ticket?"}], max_new_tokens=8)
        kn.reload()
        assert eng.venue_rows is not old and len(eng.venue_rows.rows) == 4
        assert eng.venue_rows.index is kn.index
        r = _ask(eng, "Does the shop sell postcards?")
        assert r.docs["sources"][0]["file"].endswith("shop.md")
        assert r.stats.prompt_tokens - r.stats.cached_tokens < 40  # copied, not prefilled
        late = eng.generate(before)  # read before the reload (a queued request), run after it: quoted
        assert late.docs["sources"][0]["file"].endswith("tickets.md")
        assert late.stats.prompt_tokens == before.prompt_tokens and late.stats.prompt_tokens - late.stats.cached_tokens > 40
    finally:
        _index(eng.bundle.root, eng.test_pages, kn.path, cached=True)
        kn.reload()


def test_the_passages_budget_of_the_cached_reading_is_larger(cached_engine):
    kn = cached_engine.docs
    t = kn.turn([{"role": "user", "content": "family ticket cafe hours"}])
    assert kn.cached and t.blocks and len(t.blocks) == len(t.sources)
    assert [s.id for s in t.sources] == [c + 1 for c in t.blocks]  # numbered as in the venue


def test_index_cached_passages_is_written_in_the_manifest_and_excludes_whole_venue(tiny_bundle, tmp_path,
                                                                                 monkeypatch, capsys):
    from edgespec.cli.main import main
    from helpers.venue import VENUE

    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    out = tmp_path / "c.idx"
    assert main(["index", str(VENUE), "-o", str(out), "--bundle", str(tiny_bundle), "--embedder", "none",
                 "--cached-passages"]) == 0
    assert json.loads((out / "manifest.json").read_text())["reading"] == "cached"
    capsys.readouterr()
    assert main(["index", str(VENUE), "-o", str(tmp_path / "x.idx"), "--bundle", str(tiny_bundle),
                 "--whole-venue", "--cached-passages"]) != 0
    assert "choose one" in capsys.readouterr().err and not (tmp_path / "x.idx").exists()


def test_the_memory_plan_counts_every_passage_s_rows(cached_engine):
    eng = cached_engine
    rows = eng.venue_rows
    counted = eng.memory_plan.breakdown["venue_rows"]
    per_token = eng.bundle.target.kv_bytes_per_token()
    assert counted % per_token == 0
    # an estimate from the index's counts, before any tokenizer loads (this tokenizer spells titles letter by letter)
    assert abs(counted // per_token - rows.tokens) <= 0.1 * rows.tokens, (counted // per_token, rows.tokens)


# -- at --parallel 3 (batch.py) ---------------------------------------------------------------------------
ASKS = ["How much is a family ticket?", "Does the cafe sell soup?", "When is it open daily?"]
EXACT = {"warmup": False, "draft": "none", "deterministic": True, "verify": False}  # bitwise at any batch


@pytest.fixture(scope="module")
def cached_pair(tiny_bundle, tmp_path_factory):
    """The serial engine and a 3-slot BatchEngine on one cached index, each pinned by the same flow."""
    with _tiny_venue(tmp_path_factory) as (pages, out):
        _index(tiny_bundle, pages, out, cached=True)
        serial = Engine.open(tiny_bundle, docs=str(out), **EXACT)
        batch = Engine.open(tiny_bundle, docs=str(out), parallel=3, **EXACT)
        for eng in (serial, batch):
            pin_system_prompt(eng, None)
        batch.test_pages = pages
        yield serial, batch
        serial.close()
        batch.close()


def _sources(r):
    """The files of a result's sources, by name."""
    return [Path(s["file"]).name for s in r.docs["sources"]]


def _question_only(rows, question: str) -> int:
    """The prompt tokens a turn of the cached reading prefills: its question and the template's end."""
    return len(rows.encode(f"Question: {question}")) + len(rows.tail)


def test_three_turns_at_once_copy_their_passages_and_answer_as_the_serial_engine(cached_pair):
    serial, batch = cached_pair
    rows = batch.venue_rows
    assert sorted(rows.rows) == [0, 1, 2] and batch.pinned.tokens == rows.base
    assert batch.runner.lengths == [len(rows.base)] * 3  # the base in every slot, the passages' rows aside
    assert serial.venue_rows.all_tokens() == rows.all_tokens()
    want = [_ask(serial, q) for q in ASKS]
    assert [_sources(w)[0] for w in want] == ["tickets.md", "cafe.md", "hours.md"]
    # drafting changes nothing: a fixed k, lossless from the assembled cache
    got = generate_all(batch, [*_turns(ASKS[:1], draft="ngram", k=3), *_turns(ASKS[1:2], draft="suffix", k=3),
                               *_turns(ASKS[2:])])
    for q, g, w in zip(ASKS, got, want):
        assert g.token_ids == w.token_ids and _sources(g) == _sources(w), q
        assert g.stats.prompt_tokens == w.stats.prompt_tokens, q  # the same assembled prompt
        # only the question prefilled, as the serial engine's turn: the base and the passages were copied
        assert g.stats.prompt_tokens - g.stats.cached_tokens == _question_only(rows, q), q
        assert w.stats.prompt_tokens - w.stats.cached_tokens == _question_only(rows, q), q
    # every slot overwritten by a request sharing nothing: the base and the passages come back by copy
    others = generate_all(batch, [{"prompt": f"unrelated text {i} overwrites the slot", "max_new_tokens": 2}
                                  for i in range(3)])
    assert [o.stats.cached_tokens for o in others] == [0, 0, 0]
    again = generate_all(batch, _turns(ASKS[::-1]))
    for q, g, w in zip(ASKS[::-1], again, want[::-1]):
        assert g.token_ids == w.token_ids and g.stats.prompt_tokens - g.stats.cached_tokens == _question_only(rows, q)


def test_turns_that_do_not_qualify_are_quoted_at_three_slots(cached_pair):
    serial, batch = cached_pair
    follow = [{"role": "user", "content": "How much is a family ticket?"}, {"role": "assistant", "content": "35."},
              {"role": "user", "content": "and the cafe?"}]
    other = [{"role": "system", "content": "Another kiosk."}, {"role": "user", "content": ASKS[0]}]
    asks = [{"messages": follow, "max_new_tokens": 6}, {"messages": other, "max_new_tokens": 6},
            *_turns(ASKS[:1], n=6)]
    want = [serial.generate(**a) for a in asks]
    got = generate_all(batch, asks)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.token_ids == w.token_ids and _sources(g) == _sources(w) and g.docs["sources"], i
        assert g.stats.prompt_tokens == w.stats.prompt_tokens, i
    n_base = len(batch.venue_rows.base)
    assert got[0].stats.prompt_tokens - got[0].stats.cached_tokens > 40  # the follow-up's passages prefilled
    assert got[1].stats.cached_tokens < n_base  # another system prompt: nothing of the base reused
    assert got[2].stats.prompt_tokens - got[2].stats.cached_tokens == _question_only(batch.venue_rows, ASKS[0])


def test_a_reload_while_a_request_runs_re_pins_the_free_slots(cached_pair, tmp_path):
    serial, batch = cached_pair
    want = _ask(serial, ASKS[0]).token_ids
    (tmp_path / "shop.md").write_text("# Shop\n\nIt sells postcards.\n")
    for name, text in PAGES.items():
        (tmp_path / name).write_text(text)
    old = batch.venue_rows
    running = batch.submit(**_turns(ASKS[:1])[0])
    batch.round()  # admitted: its passages copied from the rows of before the reload
    assert batch.active == 1
    _index(batch.bundle.root, tmp_path, batch.docs.path, cached=True)
    try:
        for eng in (batch, serial):
            eng.docs.reload()  # the hook re-pins: the batch's base and passages in its two free slots
        assert batch.venue_rows is not old and sorted(batch.venue_rows.rows) == [0, 1, 2, 3]
        while batch.round():
            pass
        assert running.wait(0).token_ids == want
        shop = "Does the shop sell postcards?"
        got, w = generate_all(batch, _turns([shop]))[0], _ask(serial, shop)
        assert _sources(got)[0] == "shop.md" and got.token_ids == w.token_ids
        assert got.stats.prompt_tokens - got.stats.cached_tokens == _question_only(batch.venue_rows, shop)
    finally:
        _index(batch.bundle.root, batch.test_pages, batch.docs.path, cached=True)
        for eng in (batch, serial):
            eng.docs.reload()
