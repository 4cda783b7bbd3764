"""How a costed drafter's rounds did against the other sources' rounds in the same replies.

`auto` bets a cold draft's prompt prefill on the rest of a reply. Where, in recent replies to prompts
of the same octave of length, the draft's rounds delivered fewer tokens per second than the copies
and plain steps beside them, its rounds took positions the others write faster and its prefill buys
nothing (CostedDrafter.edge, the EDGE_MIN_ROUNDS comment in costed.py). This is the record that
decision reads, one request's rounds or recent requests' summed.
"""
from __future__ import annotations

from dataclasses import astuple, dataclass


def prompt_octave(n: int) -> int:
    """The octave of a prompt length: 64-127 tokens -> 7, 128-255 -> 8."""
    return max(1, n).bit_length()


@dataclass
class Tally:
    """The draft's own rounds (tokens they wrote, seconds of its draft steps, catch-ups and verify,
    how many) and the other sources' rounds in the same replies (tokens, seconds of their verify)."""

    own_tokens: float = 0.0
    own_seconds: float = 0.0
    own_rounds: float = 0.0
    other_tokens: float = 0.0
    other_seconds: float = 0.0

    def both_ran(self) -> bool:
        return self.own_tokens > 0 and self.other_tokens > 0

    def folded(self, new: Tally, keep: float) -> Tally:
        """This record, each request in it weighted by `keep`, plus the request `new`."""
        return Tally(*(o * keep + v for o, v in zip(astuple(self), astuple(new))))

    def edge(self, min_rounds: int) -> float:
        """Its rounds' tokens per second over the others', at most 1; 1 before `min_rounds` of its rounds."""
        if self.own_rounds < min_rounds or not self.both_ran():
            return 1.0
        return min(1.0, (self.own_tokens / self.own_seconds) / (self.other_tokens / self.other_seconds))
