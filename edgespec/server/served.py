"""What the server asks of an engine: the seam its tests fake.

`edgespec.engine.Engine` is the real one (and BatchEngine's serving side); the server tests' fake
engine implements this same Protocol and returns the real result types, so a fake cannot drift from
what the handlers read.
"""
from __future__ import annotations

from typing import Iterator, Protocol

from ..engine.results import GenerationResult


class ServedStream(Protocol):
    """Iterate for text deltas; `result` once iteration has ended."""

    def __iter__(self) -> Iterator[str]: ...

    @property
    def result(self) -> GenerationResult | None: ...


class ServedEngine(Protocol):
    model_name: str
    max_len: int

    def count_tokens(self, prompt: str | None = None, *, messages=None) -> int: ...

    def stream(self, prompt: str | None = None, *, messages=None, **kw) -> ServedStream: ...

    def generate(self, prompt: str | None = None, **kw) -> GenerationResult: ...

    def close(self) -> None: ...
