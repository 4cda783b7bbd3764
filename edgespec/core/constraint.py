"""Constrained decoding: a grammar that decides which tokens may come next (structured output).

    c = grammars.compile(Grammar("json_schema", schema_text, param="json_schema"))   # one per request
    row = c.mask(row)            # [V] logits -> [V] with every token the grammar forbids at -inf
    n = c.check(draft)           # how many of draft, in order, the grammar allows (state unchanged)
    c.advance(tokens)            # the tokens the target accepted
    c.rollback(n)                # forget the last n advanced tokens
    c.forced(after)              # the tokens the grammar forces next (after `after`, state unchanged)

Speculation stays lossless under a constraint because the target's logits are masked by the grammar
state at every verified position: position i of a verified chain is masked by the state after the
chain's first i tokens, which is exactly the state target-alone decoding would be in there.

The state always matches the accepted text: a round advances it only by the tokens it accepts (and
checks proposals without consuming them), so a rejection has nothing to roll back; `forced(after)`
rolls back what it looked ahead. The grammar library is llguidance (docs/structured-output.md says
why): its masks cost tens of microseconds on a 152k vocabulary and a schema compiles lazily, in about
a millisecond, where a regex-to-automaton compiler indexes the whole vocabulary per schema.
"""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from ..errors import InvalidRequest

# What one request's grammar may cost (llguidance's parser limits), sized for a 2-8 GB board: a lexer
# state costs about 1-2 kB, so 20,000 states stay under ~40 MB; the library's default of 250,000 could
# take ~500 MB. A grammar of more than 100,000 symbols is far past any schema a client sends for one
# answer (a 200-property schema compiles to a few thousand).
MAX_LEXER_STATES = 20_000
MAX_GRAMMAR_SIZE = 100_000
MAX_GRAMMAR_TEXT = 256 * 1024  # bytes of schema or grammar text a request may carry (before compiling)


class Constraint(Protocol):
    """The grammar state of one request, as the round and the drafters use it."""

    consumed: int  # tokens advanced (and not rolled back) since the request's first generated token
    forced_count: int  # output tokens that were the grammar's only choice where they were chosen (stats)

    def mask(self, row: np.ndarray) -> np.ndarray: ...

    def check(self, tokens: Sequence[int]) -> int: ...

    def advance(self, tokens: Sequence[int]) -> None: ...

    def rollback(self, n: int) -> None: ...

    def forced(self, after: Sequence[int] = ()) -> list[int]: ...


@dataclass(frozen=True)
class Grammar:
    """What a request asks its output to follow, before compiling: kind "json_schema" (text: the
    schema as JSON) or "lark" (llguidance's Lark form, which also embeds JSON schemas with %json);
    `param` names the request field an error points at; `lenient` ignores JSON-schema keywords the
    library does not implement (OpenAI's strict=false) instead of refusing them."""

    kind: str
    text: str
    param: str = "grammar"
    lenient: bool = False


# JSON as models write it: one space after ':' and ',' (what chat models were trained on, so the
# grammar does not push them off their habits), no other whitespace (every brace, quote and key is
# then forced, which the grammar drafter proposes for free).
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class Grammars:
    """Compiles requests' grammars against one engine's vocabulary. The library's view of the
    tokenizer (a trie of 152k tokens, ~1 s) is built on the first constrained request, not at open."""

    def __init__(self, tokenizer, n_vocab: int, eos_ids: Sequence[int]):
        self.tokenizer = tokenizer  # a `tokenizers.Tokenizer`
        self.n_vocab = n_vocab  # logits row width (the mask covers every row, padding included)
        self.eos_ids = sorted(eos_ids)
        self._lt = None
        self._lock = threading.Lock()

    def _library(self):
        try:
            import llguidance
        except ImportError:  # pragma: no cover - a dependency; only a broken install lacks it
            raise InvalidRequest("structured output needs the llguidance package (pip install llguidance)",
                                 param="response_format") from None
        with self._lock:
            if self._lt is None:
                eos = self.eos_ids or None
                try:
                    self._lt = llguidance.LLTokenizer(library_view(self.tokenizer.to_str()), n_vocab=self.n_vocab,
                                                      eos_token=eos)
                except TypeError:  # older llguidance (1.6.1: the aarch64 wheel for glibc 2.28) takes one id
                    self._lt = llguidance.LLTokenizer(library_view(self.tokenizer.to_str()), n_vocab=self.n_vocab,
                                                      eos_token=eos[0] if eos else None)
        return llguidance, self._lt

    def special(self, text: str) -> int | None:
        """The id of `text` when the vocabulary has it as one added token (e.g. "<tool_call>")."""
        i = self.tokenizer.token_to_id(text)
        return int(i) if i is not None and self.tokenizer.id_to_token(i) == text else None

    def compile(self, g: Grammar) -> "GrammarConstraint":
        """A fresh state for one request; a grammar the library refuses, or one past the limits
        above, is one InvalidRequest naming g.param and the library's reason."""
        if len(g.text.encode("utf-8")) > MAX_GRAMMAR_TEXT:
            raise InvalidRequest(f"{g.param} is {len(g.text.encode('utf-8'))} bytes; at most {MAX_GRAMMAR_TEXT} "
                                 "are accepted", param=g.param)
        llg, lt = self._library()
        try:
            if g.kind == "json_schema":
                opts = dict(JSON_OPTIONS, lenient=g.lenient)
                text = llg.LLMatcher.grammar_from_json_schema(g.text, defaults=opts)
            elif g.kind == "lark":
                text = llg.LLMatcher.grammar_from_lark(g.text)
            else:
                raise InvalidRequest(f"unknown grammar kind {g.kind!r}", param=g.param)
        except ValueError as e:
            raise InvalidRequest(f"{g.param} is not valid: {_first_line(str(e))}", param=g.param) from None
        limits = llg.LLParserLimits(max_lexer_states=MAX_LEXER_STATES, max_grammar_size=MAX_GRAMMAR_SIZE,
                                    verbose_errors=False)
        m = llg.LLMatcher(lt, text, log_level=0, limits=limits)
        if m.is_error():
            raise InvalidRequest(f"{g.param} was refused by the grammar compiler: {_first_line(m.get_error())}",
                                 param=g.param)
        return GrammarConstraint(m, self.n_vocab, frozenset(self.eos_ids), g.param)


def library_view(tokenizer_json: str) -> str:
    """The tokenizer as the grammar library should read it: a byte-level vocabulary (a ByteLevel
    pre-tokenizer) gets a plain ByteLevel decoder. The GGUF converter writes some byte-level
    tokenizers (SmolLM2's) with a sentencepiece-style decoder sequence (ByteFallback, Fuse, Replace,
    ByteLevel), which llguidance then reads as sentencepiece: every 'Ġ' a literal, no token a space,
    and JSON's forced ': ' unreachable. The vocabulary itself (token -> id) is not changed."""
    d = json.loads(tokenizer_json)
    pre = d.get("pre_tokenizer") or {}
    parts = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    dec = d.get("decoder") or {}
    if any(p.get("type") == "ByteLevel" for p in parts if isinstance(p, dict)) and dec.get("type") != "ByteLevel":
        d["decoder"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": True}
        return json.dumps(d)
    return tokenizer_json


def _first_line(msg: str) -> str:
    line = msg.strip().splitlines()[0] if msg.strip() else "unknown error"
    return line[:300]


class GrammarConstraint:
    """One request's grammar state (an llguidance matcher). Tokens past the end (EOS) are never
    consumed: the request ends there."""

    def __init__(self, matcher, n_vocab: int, eos_ids: frozenset[int], param: str = "grammar"):
        self.m = matcher
        self.n_vocab = n_vocab
        self.eos_ids = eos_ids
        self.param = param
        self.consumed = 0  # tokens advanced and not rolled back
        self.forced_count = 0  # output tokens that were the grammar's forced token where they were chosen
        self._ff_next = -1  # the forced token at the position `mask` was last called for (-1: none)
        self._bits = np.zeros((n_vocab + 31) // 32, dtype=np.int32)  # the mask, one bit per token

    def __deepcopy__(self, memo) -> "GrammarConstraint":
        """One request's live state, not a value (the matcher cannot be copied): a copy of a drafter
        that holds it (the bench's per-mode snapshots) refers to the same state; every request
        attaches its own anyway."""
        return self

    def allowed(self) -> np.ndarray:
        """[n_vocab] bool: the tokens the grammar allows next."""
        self.m.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        return np.unpackbits(self._bits.view(np.uint8), bitorder="little")[: self.n_vocab].astype(bool)

    def mask(self, row: np.ndarray) -> np.ndarray:
        """row: [V] logits (V >= n_vocab) -> a copy with every forbidden token at -inf."""
        out = np.array(row, dtype=np.float32, copy=True)
        ff = self.m.compute_ff_tokens()
        self._ff_next = int(ff[0]) if ff else -1
        ok = self.allowed()
        out[: self.n_vocab][~ok] = -np.inf
        out[self.n_vocab:] = -np.inf
        return out

    def check(self, tokens: Sequence[int]) -> int:
        return int(self.m.validate_tokens([int(t) for t in tokens])) if tokens else 0

    def advance(self, tokens: Sequence[int]) -> None:
        toks = [int(t) for t in tokens if t not in self.eos_ids]
        if len(toks) == 1 and toks[0] == self._ff_next:  # the token chosen where `mask` looked
            self.forced_count += 1
        self._ff_next = -1
        if toks and not self.m.consume_tokens(toks):
            raise InvalidRequest(f"the output left the {self.param} grammar: {_first_line(self.m.get_error())}",
                                 param=self.param)
        self.consumed += len(toks)

    def rollback(self, n: int) -> None:
        if n > 0:
            self.m.rollback(n)
            self.consumed -= n

    def forced(self, after: Sequence[int] = ()) -> list[int]:
        n = self.m.try_consume_tokens([int(t) for t in after]) if after else 0
        try:
            if n < len(after):
                return []
            return [int(t) for t in self.m.compute_ff_tokens()]
        finally:
            if n:
                self.m.rollback(n)

    @property
    def done(self) -> bool:
        """Only the end of text may follow."""
        return bool(self.m.is_stopped())


def json_schema_text(schema) -> str:
    """A schema given as a dict or as JSON text -> JSON text (a bad one: InvalidRequest)."""
    if isinstance(schema, (dict, bool)):
        return json.dumps(schema)
    if isinstance(schema, str):
        try:
            json.loads(schema)
        except ValueError as e:
            raise InvalidRequest(f"json_schema is not valid JSON: {e}", param="json_schema") from None
        return schema
    raise InvalidRequest(f"json_schema must be a JSON schema (a dict or JSON text), got {type(schema).__name__}",
                         param="json_schema")
