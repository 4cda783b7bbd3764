"""Token ids -> text deltas for streaming, without broken characters and without leaking stop strings.

Two things make naive per-token decoding wrong:
- a byte-level token can hold half of a multi-byte UTF-8 character ("é", "東", an emoji): decoding
  it alone gives U+FFFD. We decode a small window of recent ids and emit only once the window's text
  no longer ends in U+FFFD.
- decoding a single id loses context-dependent spacing (SentencePiece drops a leading space at the
  start of a decode). The window always starts a few ids back, and we emit only the text that the
  newest ids added to it.

Stop strings can be split across tokens ("<|" + "end|>"), so text that could still become a stop
string is held back until the next token shows it is not one.
"""
from __future__ import annotations

from typing import Sequence

_BROKEN = "\ufffd"


class IncrementalDecoder:
    """Turns ids into text, one piece at a time; each piece is complete characters only."""

    def __init__(self, tokenizer, context: Sequence[int] = ()):
        self.tok = tokenizer
        self.ids: list[int] = list(context)[-4:]  # prompt tail: gets the first token's spacing right
        self.prefix = 0  # window start
        self.read = len(self.ids)  # ids before this are already turned into text

    def _decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    def add(self, token_id: int) -> str:
        self.ids.append(int(token_id))
        before = self._decode(self.ids[self.prefix : self.read])
        after = self._decode(self.ids[self.prefix :])
        if len(after) > len(before) and not after.endswith(_BROKEN):
            self.prefix, self.read = self.read, len(self.ids)
            return after[len(before) :]
        return ""

    def flush(self) -> str:
        """Whatever is still held (an unfinished character comes out as U+FFFD)."""
        before = self._decode(self.ids[self.prefix : self.read])
        after = self._decode(self.ids[self.prefix :])
        self.prefix = self.read = len(self.ids)
        return after[len(before) :] if len(after) > len(before) else ""


class TextStream:
    """Decoded text with stop strings applied: `push` returns the text that is safe to show now."""

    def __init__(self, tokenizer, context: Sequence[int] = (), stop: Sequence[str] = ()):
        self.dec = IncrementalDecoder(tokenizer, context)
        self.stop = [s for s in stop if s]
        self.text = ""  # all text so far (cut at the stop string once one is found)
        self.emitted = 0  # chars of text already returned
        self.stopped = False

    def push(self, token_id: int) -> str:
        """Adds one id; returns the new safe text. Sets `stopped` when a stop string completes."""
        if self.stopped:
            return ""
        self.text += self.dec.add(token_id)
        return self._release(final=False)

    def finish(self) -> str:
        """The end of generation: releases everything still held back."""
        if not self.stopped:
            self.text += self.dec.flush()
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        if self.stop and not self.stopped:
            hits = [i for i in (self.text.find(s, self.emitted) for s in self.stop) if i >= 0]
            if hits:
                self.text = self.text[: min(hits)]
                self.stopped = True
        safe = len(self.text)
        if not (final or self.stopped):
            safe -= self._held()
        out = self.text[self.emitted : safe]
        self.emitted = max(self.emitted, safe)
        return out

    def _held(self) -> int:
        """Length of the longest tail of the unreleased text that is a proper prefix of a stop string."""
        tail = self.text[self.emitted :]
        best = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(tail)), best, -1):
                if tail.endswith(s[:n]):
                    best = n
                    break
        return best
