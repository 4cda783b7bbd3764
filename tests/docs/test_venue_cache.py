"""The whole venue in the cache (docs/answer.py): the system turn holds every passage, the same for
every visitor, pinned once (engine/pinned.py); a turn carries only the question and the passages'
numbers; follow-ups are searched with the question before them; the memory plan sizes the cache for
the venue and counts its pinned rows."""
from __future__ import annotations

import pytest

from edgespec.engine import Engine
from edgespec.engine.pinned import pin_system_prompt
from edgespec.docs import answer
from edgespec.docs.answer import (DEFAULT_SYSTEM, TURN_ROOM, VENUE_LIMIT, Docs, tokenizer_sha256,
                                       venue_tokens_estimate)
from edgespec.docs.index import build_index

from helpers.venue import VENUE

SYSTEM = {"role": "system", "content": "You are the museum's kiosk."}


@pytest.fixture()
def venue(tmp_path, words):
    tok, sha = words
    build_index([VENUE], tmp_path / "venue.idx", tok, sha, whole_venue=True)
    return Docs(tmp_path / "venue.idx", tok, sha, max_len=8192)


def test_the_system_turn_holds_every_passage_and_is_the_same_for_every_question(venue):
    a = venue.turn([SYSTEM, {"role": "user", "content": "What time does the Roof Café open?"}])
    b = venue.turn([SYSTEM, {"role": "user", "content": "How much is a child ticket?"}])
    assert venue.venue is not None and not a.declined and not b.declined
    assert a.messages[0] == b.messages[0] and a.messages[0]["role"] == "system"
    system = a.messages[0]["content"]
    assert system.startswith(SYSTEM["content"] + "\n\n")
    for i, c in enumerate(venue.index.chunks):  # numbered in the index's order, every line quoted
        first = c.text.strip().split("\n")[0]
        assert f"[{i + 1}] {c.title} ({c.source.rsplit('/', 1)[-1]})\n> {first}" in system
    # the turn itself: the question and the numbers of the passages retrieval ranked first
    cafe = next(s for s in a.sources if s.title == "Cafés › Roof Café")
    assert venue.index.chunks[cafe.id - 1].title == "Cafés › Roof Café"
    assert a.messages[1]["content"].startswith("Question: What time does the Roof Café open?\n(Passages that may")
    assert f"[{cafe.id}]" in a.messages[1]["content"] and "> " not in a.messages[1]["content"]
    assert cafe.text == venue.index.chunks[cafe.id - 1].text and a.docs()["sources"][0]["text"]


def test_a_request_without_a_system_prompt_gets_the_default_one(venue):
    t = venue.turn([{"role": "user", "content": "How much is a child ticket?"}])
    assert [m["role"] for m in t.messages] == ["system", "user"]
    assert t.messages[0]["content"] == venue.system(None) and t.messages[0]["content"].startswith(DEFAULT_SYSTEM)


def test_a_follow_up_is_searched_with_the_question_before_it(venue):
    follow = [SYSTEM, {"role": "user", "content": "How much is a family ticket?"},
              {"role": "assistant", "content": "It is in the passages."},
              {"role": "user", "content": "and on a sunday?"}]
    alone = venue.turn([SYSTEM, {"role": "user", "content": "and on a sunday?"}])
    t = venue.turn(follow)
    assert any(s.file.endswith("tickets.md") for s in t.sources), [s.file for s in t.sources]
    assert not any(s.file.endswith("tickets.md") for s in alone.sources)
    assert t.messages[1:3] == follow[1:3]  # earlier turns as the visitor wrote them


def test_a_venue_too_large_for_the_cache_is_quoted_per_turn(tmp_path, words):
    tok, sha = words
    build_index([VENUE], tmp_path / "v.idx", tok, sha, whole_venue=True)
    small = Docs(tmp_path / "v.idx", tok, sha, max_len=TURN_ROOM + 16)
    t = small.turn([SYSTEM, {"role": "user", "content": "How much is a child ticket?"}])
    assert small.venue is None and t.messages[0] == SYSTEM and "> " in t.messages[1]["content"]
    assert Docs(tmp_path / "v.idx", tok, sha).venue is None  # no cache length given: quoted
    build_index([VENUE], tmp_path / "p.idx", tok, sha)  # the default reading: passages quoted per turn
    assert Docs(tmp_path / "p.idx", tok, sha, max_len=8192).venue is None
    assert venue_tokens_estimate(tmp_path / "p.idx") is None


def test_the_estimate_covers_the_venue_and_refuses_a_huge_one(venue, words, tmp_path):
    n = len(venue.tokenizer.encode(venue.system(None), add_special_tokens=False).ids)
    est = venue_tokens_estimate(venue.path)
    assert n <= est <= n + 400, (n, est)
    big = tmp_path / "big"
    big.mkdir()
    for i in range(VENUE_LIMIT // 100 + 1):
        (big / f"p{i}.md").write_text(f"# Page {i}\n\n" + " ".join(["ticket"] * 120) + f" {i}\n")
    build_index([big], tmp_path / "big.idx", *words, whole_venue=True)
    assert venue_tokens_estimate(tmp_path / "big.idx") is None


# -- the engine ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def venue_engine(tiny_bundle, tmp_path_factory):
    """The tiny model reads 512 positions: a two-page venue, and a conversation's room to match."""
    from tokenizers import Tokenizer

    pages = tmp_path_factory.mktemp("pages")
    (pages / "tickets.md").write_text("# Tickets\n\nA family ticket costs 35 euros.\n")
    (pages / "hours.md").write_text("# Hours\n\nOpen daily from 10 to 6.\n")
    out = tmp_path_factory.mktemp("venue") / "venue.idx"
    tok = Tokenizer.from_file(str(tiny_bundle / "tokenizer.json"))
    build_index([pages], out, tok, tokenizer_sha256(tiny_bundle), whole_venue=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(answer, "TURN_ROOM", 96)
        for name, short in (("VENUE_HEAD", "Documents:"), ("VENUE_RULES", "Answer from them."),
                            ("DEFAULT_SYSTEM", "Kiosk.")):  # its tokenizer spells most words letter by letter
            mp.setattr(answer, name, short)
        eng = Engine.open(tiny_bundle, docs=str(out), warmup=False, draft="none")
        eng.test_pages = pages
        yield eng
        eng.close()


def test_the_plan_sizes_the_cache_for_the_venue_and_counts_its_pinned_rows(venue_engine):
    kn = venue_engine.docs
    est = venue_tokens_estimate(kn.path)
    assert kn.venue is not None and venue_engine.max_len >= est + answer.TURN_ROOM
    plan = venue_engine.memory_plan
    assert plan.breakdown["venue_rows"] == est * venue_engine.bundle.target.kv_bytes_per_token()


def test_a_visitor_prefills_only_the_question_and_answers_as_without_the_pin(venue_engine, tmp_path):
    eng = venue_engine
    pin = pin_system_prompt(eng, SYSTEM["content"], save_dir=tmp_path)
    try:
        venue_tokens = len(pin.tokens)
        assert venue_tokens > 60 and pin.text == SYSTEM["content"]
        msgs = [SYSTEM, {"role": "user", "content": "How much is a family ticket?"}]
        eng.generate("unrelated text that overwrites the cache", max_new_tokens=2)
        r = eng.generate(messages=msgs, max_new_tokens=6)
        turn = eng.docs.turn(msgs).messages[-1]["content"]
        asked = len(eng.tokenizer.encode(turn, add_special_tokens=False).ids)
        assert r.stats.cached_tokens >= venue_tokens and r.stats.prompt_tokens - r.stats.cached_tokens <= asked + 16  # + the turn's markers
        assert r.docs["sources"][0]["file"].endswith("tickets.md")
        eng.pinned = None
        eng.reset_cache()
        cold = eng.generate(messages=msgs, max_new_tokens=6)  # the whole prompt prefilled: the same answer
        assert cold.stats.cached_tokens == 0 and cold.token_ids == r.token_ids
        # a restart loads the saved rows instead of prefilling
        again = pin_system_prompt(eng, SYSTEM["content"], save_dir=tmp_path)
        assert again.source == "file" and again.tokens == pin.tokens
    finally:
        eng.pinned = None


def test_a_reload_pins_the_new_venue(venue_engine, tmp_path):
    from tokenizers import Tokenizer

    eng = venue_engine
    kn = eng.docs
    pin = pin_system_prompt(eng, None)
    more = tmp_path / "more"
    more.mkdir()
    (more / "shop.md").write_text("# Shop\n\nIt sells lighthouse postcards.\n")
    tok = Tokenizer.from_file(str(eng.bundle.root / "tokenizer.json"))
    build_index([eng.test_pages, more], kn.path, tok, kn.tokenizer_sha256, whole_venue=True)
    try:
        kn.reload()
        assert "lighthouse postcards" in kn.venue and eng.pinned is not pin
        assert eng.pinned.tokens == eng.encode(messages=[{"role": "system", "content": kn.system(None)},
                                                         {"role": "user", "content": "x"}])[: len(eng.pinned.tokens)]
        assert len(eng.pinned.tokens) > len(pin.tokens)
    finally:
        build_index([eng.test_pages], kn.path, tok, kn.tokenizer_sha256, whole_venue=True)
        kn.reload()
        eng.pinned = None


class _Bilingual:
    """Texts about tickets, in English or Japanese, point one way; everything else another."""

    model_id, dim = "fake/bilingual", 2

    def embed(self, texts):
        import numpy as np

        return np.array([[1.0, 0.0] if ("ticket" in t.lower() or "入園料" in t) else [0.0, 1.0] for t in texts],
                        dtype=np.float32)


def test_a_question_in_another_script_is_left_to_the_model(tmp_path, words):
    tok, sha = words
    build_index([VENUE], tmp_path / "v.idx", tok, sha, _Bilingual())
    kn = Docs(tmp_path / "v.idx", tok, sha, _Bilingual())
    t = kn.turn([{"role": "user", "content": "大人の入園料はいくらですか？"}])  # no word of it is in the pages
    assert t.match < kn.min_coverage and not t.declined
    assert t.sources[0].file.endswith("tickets.md")
    bare = Docs(tmp_path / "v.idx", tok, sha, _Bilingual())
    bare.index.vectors = None  # without vectors nothing says where it belongs: declined, as before
    assert bare.turn([{"role": "user", "content": "大人の入園料はいくらですか？"}]).declined
    # a question in the pages' own script is gated by its words as before
    assert kn.turn([{"role": "user", "content": "Is there a swimming pool?"}]).declined


def test_a_reload_that_changes_nothing_keeps_the_pin(venue_engine):
    eng = venue_engine
    pin = pin_system_prompt(eng, None)
    try:
        eng.docs.reload()
        assert eng.pinned is pin  # no prefill, no copy: the same tokens are pinned already
    finally:
        eng.pinned = None


def test_index_whole_venue_is_written_in_the_manifest(tiny_bundle, tmp_path, monkeypatch):
    import json

    from edgespec.cli.main import main

    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    for flags, reading in (([], "passages"), (["--whole-venue"], "whole")):
        out = tmp_path / f"{reading}.idx"
        assert main(["index", str(VENUE), "-o", str(out), "--bundle", str(tiny_bundle), "--embedder", "none",
                     *flags]) == 0
        assert json.loads((out / "manifest.json").read_text())["reading"] == reading
