"""The venue's documents and the pinned system prompt in the batched engine (docs=INDEX, parallel=3):
each question answered with the serial engine's text and sources, a declined one without the model,
three at once; the system prompt's rows kept once, in every slot, reused by each and copied back into a
slot another request overwrote."""
from __future__ import annotations

import pytest

from edgespec.engine import Engine
from edgespec.engine.pinned import prefix_tokens
from edgespec.errors import InvalidRequest
from edgespec.docs.answer import DECLINE, tokenizer_sha256
from edgespec.docs.index import build_index

from helpers.venue import VENUE

SYSTEM = "You are the museum's kiosk. Answer in one short sentence."
ASKS = ["How much is a family ticket?", "What time does the Roof Café open?", "What is the Wi-Fi password?"]
N = 12  # tokens each answer may take
OPTS = {"max_len": 1024, "draft": "none", "deterministic": True, "warmup": False, "verify": False}


@pytest.fixture(scope="module")
def index(tiny_bundle, tmp_path_factory):
    from tokenizers import Tokenizer

    out = tmp_path_factory.mktemp("docs") / "venue.idx"
    build_index([VENUE], out, Tokenizer.from_file(str(tiny_bundle / "tokenizer.json")), tokenizer_sha256(tiny_bundle))
    return out


@pytest.fixture(scope="module")
def serial(tiny_bundle, index):
    eng = Engine.open(tiny_bundle, docs=str(index), **OPTS)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def batch(tiny_bundle, index):
    eng = Engine.open(tiny_bundle, parallel=3, docs=str(index), **OPTS)
    yield eng
    eng.close()


def _msgs(question, system=None):
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": question}]


def _docs(result):
    """The result's `docs` without its retrieval time (a measurement, not an answer)."""
    return {k: v for k, v in result.docs.items() if k != "retrieval_s"}


def _alone(eng, question, system=None):
    eng.reset_cache()
    return eng.generate(messages=_msgs(question, system), max_new_tokens=N)


def _three_at_once(batch, system=None):
    """Submits every question, then runs rounds here; returns (results, streamed texts, most requests
    generating in one round)."""
    streamed = {i: [] for i in range(len(ASKS))}
    tickets = [batch.submit(messages=_msgs(q, system), max_new_tokens=N, on_delta=streamed[i].append)
               for i, q in enumerate(ASKS)]
    most = 0
    for _ in range(10_000):  # a hang guard: a few dozen rounds are enough
        if not batch.round():
            break
        most = max(most, batch.last_batch)
    else:
        pytest.fail("the batch did not finish in 10,000 rounds")
    return [t.wait(0) for t in tickets], ["".join(streamed[i]) for i in range(len(ASKS))], most


def test_three_questions_at_once_get_the_serial_answers_and_sources(serial, batch):
    want = [_alone(serial, q) for q in ASKS]
    assert [w.docs["declined"] for w in want] == [False, False, True]  # the third is not in the documents
    assert want[0].docs["sources"][0]["file"].endswith("tickets.md") and want[2].text == DECLINE
    got, streamed, most = _three_at_once(batch)
    assert most == 2  # the two answered questions were verified in the same passes
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.text == w.text and g.token_ids == w.token_ids, i
        assert _docs(g) == _docs(w), i
        assert streamed[i] == g.text, i
    assert got[2].stats.target_passes == 0 and got[2].finish_reason == "stop"
    assert got[0].stats.prompt_tokens == want[0].stats.prompt_tokens  # the passages were read in the batch too


def test_a_completion_is_not_retrieved_for(batch):
    assert batch.generate(ASKS[2], max_new_tokens=2).docs is None  # a prompt, not a chat turn: not declined either


def test_a_pinned_system_prompt_is_in_every_slot_and_reused(serial, batch):
    pin = batch.pin(SYSTEM)
    tokens, chat = prefix_tokens(batch, SYSTEM)
    assert pin.tokens == tokens and pin.text == SYSTEM and chat and pin.source == "prefill"
    # its rows kept once (the serial engine's snapshot: key_0, value_0, ... of the prompt's tokens)
    assert len(pin.rows) == 2 * batch.bundle.target.layers and {r.shape[2] for r in pin.rows} == {len(tokens)}
    assert batch.runner.lengths == [len(tokens)] * 3
    want = [_alone(serial, q, SYSTEM) for q in ASKS]
    got, _, _ = _three_at_once(batch, SYSTEM)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.text == w.text and _docs(g) == _docs(w), i
    assert [g.stats.cached_tokens for g in got[:2]] == [len(tokens)] * 2  # each slot skipped the prompt's prefill


def test_a_slot_another_request_overwrote_gets_the_pinned_prompt_back_by_copy(serial, batch, monkeypatch):
    pin = batch.pin(SYSTEM)
    n = len(pin.tokens)
    copies = dict.fromkeys(range(3), 0)  # slot -> snapshots written back into it (Slot.restore)
    for s in range(3):
        view = batch.runner.slot(s)

        def restore(rows, s=s, real=view.restore):
            copies[s] += 1
            real(rows)

        monkeypatch.setattr(view, "restore", restore)
    others = [batch.submit(f"unrelated text number {i} that shares nothing", max_new_tokens=2) for i in range(3)]
    while batch.round():
        pass
    assert [t.wait(0).stats.cached_tokens for t in others] == [0, 0, 0]  # every slot overwritten
    assert all(batch.runner.slot(s).length < n for s in range(3))
    want = [_alone(serial, q, SYSTEM) for q in ASKS]
    got, _, _ = _three_at_once(batch, SYSTEM)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.token_ids == w.token_ids and _docs(g) == _docs(w), i
    # the two answered questions found their slots without the prompt: each got its rows back by one copy
    # and prefilled only its turn (the declined third never took a slot)
    assert sorted(copies.values()) == [0, 1, 1]
    assert [g.stats.cached_tokens for g in got[:2]] == [n, n]
    assert [g.stats.prompt_tokens for g in got[:2]] == [w.stats.prompt_tokens for w in want[:2]]


def test_pin_is_refused_while_requests_wait(batch):
    t = batch.submit(messages=_msgs(ASKS[0]), max_new_tokens=2)
    with pytest.raises(InvalidRequest, match="pin before serving"):
        batch.pin(SYSTEM)
    while batch.round():
        pass
    assert t.wait(0).docs["declined"] is False


@pytest.fixture(scope="module")
def whole_venue(tiny_bundle, tmp_path_factory):
    """A two-page venue read whole (`index --whole-venue`), sized for the tiny model's 512 positions (the
    system turn's texts shortened: its tokenizer spells most words letter by letter)."""
    from tokenizers import Tokenizer

    from edgespec.docs import answer

    pages = tmp_path_factory.mktemp("pages")
    (pages / "tickets.md").write_text("# Tickets\n\nA family ticket costs 35 euros.\n")
    (pages / "hours.md").write_text("# Hours\n\nOpen daily from 10 to 6.\n")
    out = tmp_path_factory.mktemp("venue") / "venue.idx"
    build_index([pages], out, Tokenizer.from_file(str(tiny_bundle / "tokenizer.json")), tokenizer_sha256(tiny_bundle),
                whole_venue=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(answer, "TURN_ROOM", 96)
        for name, short in (("VENUE_HEAD", "Documents:"), ("VENUE_RULES", "Answer from them."),
                            ("DEFAULT_SYSTEM", "Kiosk.")):
            mp.setattr(answer, name, short)
        opts = {**OPTS, "max_len": None}  # the plan sizes the cache for the venue
        serial = Engine.open(tiny_bundle, docs=str(out), **opts)
        batch = Engine.open(tiny_bundle, parallel=2, docs=str(out), **opts)
        yield serial, batch
        serial.close()
        batch.close()


def test_the_whole_venue_is_prefilled_in_every_slot_and_answers_as_alone(whole_venue):
    serial, batch = whole_venue
    # the venue read whole: both pages in the system turn, the same text the serial engine pins
    assert batch.docs.venue == serial.docs.venue
    assert "A family ticket costs 35 euros." in batch.docs.venue and "Open daily from 10 to 6." in batch.docs.venue
    pin = batch.pin(None)  # serve pins the venue's system turn without --system-prompt too
    assert pin.text == "" and batch.runner.lengths == [len(pin.tokens)] * 2 and len(pin.tokens) > 60
    asks = ["How much is a family ticket?", "What are the hours? Is it open daily?"]
    tickets = [batch.submit(messages=_msgs(q), max_new_tokens=N) for q in asks]
    while batch.round():
        pass
    for q, t in zip(asks, tickets):
        got, want = t.wait(0), _alone(serial, q)
        assert got.token_ids == want.token_ids and _docs(got) == _docs(want), q
        assert got.docs["declined"] is False and got.stats.cached_tokens == len(pin.tokens)  # read only the question
    assert tickets[0].wait(0).docs["sources"][0]["file"].endswith("tickets.md")
