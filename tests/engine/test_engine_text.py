"""Streaming text: multi-byte characters split across tokens, stop strings split across tokens,
chat template rendering."""
from __future__ import annotations

import pytest

from edgespec.models.bundle import Bundle
from edgespec.core.chat import render, validate_messages
from edgespec.core.detokenize import IncrementalDecoder, TextStream
from edgespec.errors import InvalidRequest

TEXT = "Grüße aus München, naïve café, 東京, Привет мир, emoji 🙂 and ✓ marks. def add(a, b):"


@pytest.fixture(scope="module")
def tok(tiny_bundle):
    return Bundle.open(tiny_bundle).load_tokenizer()


def test_the_text_really_splits_characters_across_tokens(tok):
    """Guard for the tests below: some single tokens of TEXT hold half a character."""
    ids = tok.encode(TEXT, add_special_tokens=False).ids
    assert any("\ufffd" in tok.decode([i]) for i in ids)


def test_incremental_decoding_never_yields_broken_characters(tok):
    ids = tok.encode(TEXT, add_special_tokens=False).ids
    dec = IncrementalDecoder(tok)
    pieces = [dec.add(i) for i in ids] + [dec.flush()]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == TEXT


def test_incremental_decoding_with_prompt_context(tok):
    ids = tok.encode(TEXT, add_special_tokens=False).ids
    for cut in range(1, len(ids) - 1):
        dec = IncrementalDecoder(tok, ids[:cut])
        out = "".join(dec.add(i) for i in ids[cut:]) + dec.flush()
        assert tok.decode(ids[:cut]) + out == TEXT or "\ufffd" in tok.decode(ids[:cut])


def test_stop_string_across_tokens_is_held_back_then_cut(tok):
    ids = tok.encode(TEXT, add_special_tokens=False).ids
    stop = "café, 東"  # spans several tokens, one of them a partial character
    ts = TextStream(tok, (), [stop])
    shown = ""
    for i in ids:
        shown += ts.push(i)
        assert stop[:3] not in shown[len("Grüße aus München, naïve "):]  # never shown even partly
        if ts.stopped:
            break
    shown += ts.finish()
    assert ts.stopped
    assert shown == ts.text == TEXT[: TEXT.index(stop)]


def test_held_text_is_released_when_it_is_not_a_stop(tok):
    ids = tok.encode(TEXT, add_special_tokens=False).ids
    ts = TextStream(tok, (), ["München!", "🙂 and ✓ marks. NOPE"])
    shown = "".join(ts.push(i) for i in ids) + ts.finish()
    assert not ts.stopped and shown == TEXT


def test_stop_at_the_very_start_and_several_stops(tok):
    ids = tok.encode(TEXT, add_special_tokens=False).ids
    ts = TextStream(tok, (), ["naïve", "Grü"])
    shown = "".join(ts.push(i) for i in ids) + ts.finish()
    assert ts.stopped and shown == ""
    ts = TextStream(tok, (), ["東京", "München"])  # the earliest occurrence wins
    shown = "".join(ts.push(i) for i in ids) + ts.finish()
    assert shown == "Grüße aus "


def test_chat_render_and_validation():
    tpl = "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"
    msgs = [{"role": "user", "content": "hi"}]
    assert render(tpl, msgs) == "[user]hi[assistant]"
    assert render(tpl, msgs, add_generation_prompt=False) == "[user]hi"
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert render(tpl, parts) == "[user]ab[assistant]"
    with pytest.raises(InvalidRequest, match="no chat template"):
        render(None, msgs)
    with pytest.raises(InvalidRequest, match="chat template"):
        render("{{ raise_exception('only user and assistant') }}", msgs)
    with pytest.raises(InvalidRequest, match="chat template"):
        render("{% for %}", msgs)
    # empty content is accepted, as OpenAI does (docs/server.md): the template still frames the turn
    assert validate_messages([{"role": "user", "content": ""}, {"role": "user", "content": []}])[1]["content"] == ""
    with pytest.raises(InvalidRequest, match="only text"):
        validate_messages([{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}])


def test_chat_template_sandbox():
    with pytest.raises(InvalidRequest):
        render("{{ ''.__class__.__mro__[1].__subclasses__() }}", [{"role": "user", "content": "x"}])
