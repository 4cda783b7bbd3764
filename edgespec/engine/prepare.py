"""A request's documents, read before it is parsed: the engine's side of `--docs INDEX`.

    docs = open_docs(settings, bundle, tokenizer, max_len)   # None without docs=INDEX
    prepared = prepare_request(docs, options, parse, count_tokens, max_len)

A chat turn reads its passages here, on the caller's thread, before the options are parsed and the
prompt tokenized (requests.py), so a request reads the same prompt at every --parallel.
"""
from __future__ import annotations

import dataclasses

from ..errors import PromptTooLong
from ..docs.answer import Turn
from .requests import Options, Prepared
from .settings import Settings


def open_docs(s: Settings, bundle, tokenizer, max_len: int):
    """The documents an engine opened with docs=INDEX answers from (None without)."""
    if s.docs is None:
        return None
    from ..docs.answer import Docs

    return Docs.open(s.docs, bundle, tokenizer, max_len=max_len)


def prepare_request(docs, o: Options, parse, count_tokens, max_len: int) -> Prepared:
    """The engine's prepare(): the documents' turn read (read_documents), then the options parsed
    and tokenized, unless the documents declined the turn. The documents' reload count is taken
    before the turn is read, so a reload after it is seen when the request runs."""
    read = docs.generation if docs is not None else None
    o, turn = read_documents(docs, o, count_tokens, max_len)
    return Prepared(o, None if turn is not None and turn.declined else parse(o), turn, read)


def read_documents(docs, o: Options, count_tokens, max_len: int) -> tuple[Options, Turn | None]:
    """A chat request without tools answered from documents (docs/answer.py): (the options to
    generate from, with the passages in the last user turn; the Turn, None when the request does not
    read documents). The room left for passages is the cache less the conversation and some answer.
    A declined turn's options are the request's own: the caller answers it without the model."""
    if docs is None or o.messages is None or o.tools:
        return o, None
    n = count_tokens(messages=o.messages)
    if n >= max_len:  # too long before any passage: refused as it is without documents, not declined
        raise PromptTooLong(n, o.max_new_tokens, max_len)
    turn = docs.turn(o.messages, max_len - n - min(o.max_new_tokens, 128))
    return (o if turn.declined else dataclasses.replace(o, messages=turn.messages)), turn
