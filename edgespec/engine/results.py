"""What a request gives back: the result, its statistics, and the stream that yields it."""
from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Generator


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    new_tokens: int = 0
    target_passes: int = 0  # target steps, the prefill counted once
    drafted: int = 0  # proposals the target checked (a tree round counts its depth; tree_nodes has all nodes)
    accepted: int = 0
    acceptance_rate: float = 0.0  # accepted / drafted
    tokens_per_pass: float = 0.0  # new tokens / target passes (1.0 for the target alone)
    ttft_s: float = 0.0  # request start -> first token chosen (tokenizing and prefill included)
    prefill_s: float = 0.0  # time in this request's own prompt passes (other requests' decode
    #                         rounds wait for them: loadtest's decode tok/s leaves them out)
    decode_tokens_per_second: float = 0.0  # tokens after the first / time after the first
    total_s: float = 0.0
    drafter: str = "none"  # the mode the request ran with
    k_mean: float = 0.0  # proposals per decode round
    energy_j_per_token: float | None = None  # None without a power sensor
    cached_tokens: int = 0  # prompt tokens reused from the previous request's cache
    rounds: int = 0  # decode rounds (target passes after the prefill)
    rounds_by_source: dict[str, int] = field(default_factory=dict)  # "model" | "suffix" | ... | "none" -> rounds
    accepted_by_source: dict[str, int] = field(default_factory=dict)  # source -> accepted proposals
    tree: str = "off"  # the tree mode the request ran with ("auto" | "on" | "off")
    tree_rounds: int = 0  # rounds verified as a tree (engine/tree_round.py)
    tree_nodes: int = 0  # tree nodes verified, roots included
    tree_shapes: dict[str, int] = field(default_factory=dict)  # nodes per depth, e.g. "1-2" -> rounds
    accepted_depth: dict[int, int] = field(default_factory=dict)  # tree rounds by accepted path depth
    tree_off_chain: int = 0  # tree rounds whose accepted path left the drafter's own chain
    forced_tokens: int = 0  # output tokens the request's grammar forced (structured output; 0 without one)
    batch_size_mean: float = 1.0  # requests verified in the same pass, averaged over decode rounds (server --parallel)

    @property
    def tokens_per_second(self) -> float:
        return self.decode_tokens_per_second

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["tokens_per_second"] = self.decode_tokens_per_second
        return d


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" | "length" | "cache_full" | "cancelled"
    stats: GenerationStats
    # a request with tools: the call the answer made, OpenAI-shaped ([{"id", "type": "function",
    # "function": {"name", "arguments": JSON text}}]); None for a text answer (engine/structured.py)
    tool_calls: list[dict] | None = None
    # an engine with documents (docs=INDEX): {"sources": [...], "declined": bool, ...} (docs/answer.py)
    docs: dict | None = None


class Stream:
    """Iterate for text deltas; `result` holds the GenerationResult once iteration has ended (the
    generator's return value). Breaking out early (or `close()`) ends generation and frees the
    engine for the next request."""

    def __init__(self, gen: Generator[str, None, GenerationResult], prompt_tokens: int):
        self._gen = gen
        self._result: GenerationResult | None = None
        self.prompt_tokens = prompt_tokens  # known before the first delta (validated and tokenized on creation)

    def __iter__(self) -> "Stream":
        return self

    def __next__(self) -> str:
        try:
            return next(self._gen)
        except StopIteration as done:
            self._result = done.value
            raise

    def close(self) -> None:
        self._gen.close()

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def result(self) -> GenerationResult | None:
        return self._result


@dataclass(eq=False)  # compared and hashed by identity: a scheduler keys its jobs by ticket
class Ticket:
    """A request's handle. `on_delta(text)` is called from the batch thread for each text delta;
    `done` is set once `result` (or `error`) is there."""

    id: int
    prompt_tokens: int
    on_delta: Callable[[str], None] | None = None
    on_start: Callable[[], None] | None = None  # called when it takes a slot (its prompt starts being read)
    result: GenerationResult | None = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def wait(self, timeout: float | None = None) -> GenerationResult:
        if not self.done.wait(timeout):
            raise TimeoutError(f"request {self.id} did not finish within {timeout} s")
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result
