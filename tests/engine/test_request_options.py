"""A request's own values are checked as its Options are made (engine/requests.py), before the engine
reads anything for it: a chat turn the venue's documents would decline is refused for a bad value,
not answered with the decline (the documents are read before the request is parsed, and a declined
turn is never parsed)."""
from __future__ import annotations

import pytest

from edgespec.engine import Engine
from edgespec.errors import InvalidRequest
from edgespec.docs.answer import tokenizer_sha256
from edgespec.docs.index import build_index

from helpers.venue import VENUE

DECLINED = [{"role": "user", "content": "What is the Wi-Fi password?"}]  # not in the venue's documents


@pytest.fixture(scope="module")
def docs_engine(tiny_bundle, tmp_path_factory):
    from tokenizers import Tokenizer

    index = tmp_path_factory.mktemp("docs") / "venue.idx"
    build_index([VENUE], index, Tokenizer.from_file(str(tiny_bundle / "tokenizer.json")), tokenizer_sha256(tiny_bundle))
    eng = Engine.open(tiny_bundle, docs=str(index), max_len=1024, draft="none", warmup=False, verify=False)
    yield eng
    eng.close()


@pytest.mark.parametrize("kw, param", [
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(top_k=-1), "top_k"),
    (dict(temperature=-1.0), "temperature"),
    (dict(stop=[""]), "stop"),
    (dict(k=0), "k"),
    (dict(tree="wide"), "tree"),
    (dict(draft="magic"), "draft"),
])
def test_a_bad_value_is_refused_before_the_documents_are_read(docs_engine, monkeypatch, kw, param):
    reads = []
    real_turn = docs_engine.docs.turn
    monkeypatch.setattr(docs_engine.docs, "turn", lambda *a, **k: reads.append(a) or real_turn(*a, **k))
    assert docs_engine.prepare(messages=DECLINED).request is None  # good values: declined, no model needed
    assert len(reads) == 1
    with pytest.raises(InvalidRequest) as e:
        docs_engine.prepare(messages=DECLINED, **kw)
    assert e.value.param == param and len(reads) == 1, str(e.value)  # refused; the documents were not read again
