"""One model, one onnxruntime session, one KV cache allocated once and written in place.

The graph (docs/ARCHITECTURE.md, "Graph contract") takes `past_key_values.{i}.key|value` of shape
[1, kv_heads, MAX, head_dim] and returns `present.{i}.key|value` of the same shape. Binding both to
the *same* OrtValue makes GroupQueryAttention write the new rows into the buffer we own, so a step
allocates and copies no cache. The cache length L is just a number we keep: the graph learns it from
the width of `attention_mask` (L + S), and rewinding is setting L back, since rows past L are never
read and are overwritten by the next step.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..errors import EdgespecError
from ..models.manifest import ModelFacts

_NP_DTYPES = {"float32": np.float32, "float16": np.float16}
log = logging.getLogger("edgespec.runner")


class CacheFull(EdgespecError):
    """A step would write past the end of the preallocated cache. Nothing was written."""


@dataclass
class StepTimes:
    """Wall time of steps by number of input tokens: the cost model the drafter's k choice reads."""

    total_s: dict[int, float] = field(default_factory=dict)
    count: dict[int, int] = field(default_factory=dict)
    # The last few times by tokens per step. The cost model wants today's cost (after warm-up,
    # under the current thermal state) and must not be thrown by a burst of interference from
    # other processes, hence a median of recent steps rather than an all-time or moving mean.
    window: int = 9
    _recent: dict[int, deque] = field(default_factory=dict, repr=False)
    _medians: dict[int, float] | None = field(default=None, repr=False)

    def add(self, n_tokens: int, seconds: float) -> None:
        c = self.count.get(n_tokens, 0)
        self.total_s[n_tokens] = self.total_s.get(n_tokens, 0.0) + seconds
        self.count[n_tokens] = c + 1
        q = self._recent.setdefault(n_tokens, deque(maxlen=self.window))
        if c == 1 and q and seconds < q[-1]:
            q.clear()  # the first run of a shape pays one-off allocations: drop it
        q.append(seconds)
        self._medians = None

    def mean(self, n_tokens: int) -> float | None:
        c = self.count.get(n_tokens)
        return self.total_s[n_tokens] / c if c else None

    def recent(self, n_tokens: int) -> float | None:
        return self.recent_s.get(n_tokens)

    @property
    def recent_s(self) -> dict[int, float]:
        """Median of the recent steps, by tokens per step (cached until the next step)."""
        if self._medians is None:
            self._medians = {n: sorted(q)[len(q) // 2] for n, q in self._recent.items() if q}
        return self._medians


class ModelRunner:
    """`step(tokens, n_logits)` appends tokens to the cache and returns the last n_logits rows of
    logits; `rewind(length)` forgets everything after `length`.

    Shapes: tokens [S] -> logits [n_logits, vocab]; cache buffers [1, kv_heads, max_len, head_dim].
    """

    def __init__(self, session, facts: ModelFacts, max_len: int, *, device: str = "cpu", device_id: int = 0):
        import onnxruntime as ort

        if max_len < 2:
            raise ValueError(f"max_len must be at least 2, got {max_len}")
        self.session = session
        self.facts = facts
        self.max_len = int(max_len)
        self.length = 0  # tokens currently held in the cache
        self.times = StepTimes()
        self.vocab_size = facts.vocab_size
        self._has_logits_to_keep = facts.logits_to_keep is not None and facts.logits_to_keep in {
            i.name for i in session.get_inputs()
        }
        kv_dtype = _NP_DTYPES[facts.kv_dtype]
        shape = (1, facts.kv_heads, self.max_len, facts.head_dim)
        self._kv: list = []  # OrtValues, in binding order: (key_0, value_0, key_1, ...)
        for _ in range(facts.layers):
            for _ in ("key", "value"):
                if device == "cpu":
                    ov = ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, dtype=kv_dtype))
                else:
                    ov = ort.OrtValue.ortvalue_from_shape_and_type(list(shape), kv_dtype, device, device_id)
                self._kv.append(ov)
        # attention_mask is all ones; the graph reads only its width. One buffer, sliced per step.
        self._ones = np.ones((1, self.max_len), dtype=np.int64)
        self._logits_dtype = _NP_DTYPES[facts.logits_dtype]
        self._logits_bufs: dict[int, tuple[np.ndarray, object]] = {}  # n_logits -> (array, OrtValue)
        self._binding = session.io_binding()
        for i in range(facts.layers):
            k, v = self._kv[2 * i], self._kv[2 * i + 1]
            self._binding.bind_ortvalue_input(facts.past_key % i, k)
            self._binding.bind_ortvalue_input(facts.past_value % i, v)
            self._binding.bind_ortvalue_output(facts.present_key % i, k)
            self._binding.bind_ortvalue_output(facts.present_value % i, v)
        self._ort = ort

    @property
    def free(self) -> int:
        """Positions left in the cache."""
        return self.max_len - self.length

    def kv_bytes(self) -> int:
        return self.facts.kv_bytes_per_token() * self.max_len

    def kv_pair(self, layer: int):
        """The (key, value) OrtValues of one layer: the self-draft runner binds them too."""
        return self._kv[2 * layer], self._kv[2 * layer + 1]

    def _logits_out(self, n_rows: int):
        buf = self._logits_bufs.get(n_rows)
        if buf is None:
            arr = np.empty((1, n_rows, self.vocab_size), dtype=self._logits_dtype)
            buf = (arr, self._ort.OrtValue.ortvalue_from_numpy(arr))
            self._logits_bufs[n_rows] = buf
        return buf

    def step(self, tokens: Sequence[int], n_logits: int = 1) -> np.ndarray:
        """Runs the graph on `tokens` placed at positions [length, length+S) and returns logits of the
        last `n_logits` of them, shape [n_logits, vocab] (a view into a reused buffer: copy it if it
        must outlive the next step). Raises CacheFull, writing nothing, if they do not fit."""
        s = len(tokens)
        if s == 0:
            raise ValueError("step needs at least one token")
        if not 1 <= n_logits <= s:
            raise ValueError(f"n_logits must be in [1, {s}], got {n_logits}")
        if self.length + s > self.max_len:
            raise CacheFull(f"{s} token(s) at position {self.length} do not fit a cache of {self.max_len}")
        t0 = time.perf_counter()
        b = self._binding
        f = self.facts
        b.bind_cpu_input(f.input_ids, np.asarray(tokens, dtype=np.int64).reshape(1, s))
        b.bind_cpu_input(f.attention_mask, self._ones[:, : self.length + s])
        rows = n_logits if self._has_logits_to_keep else s
        if self._has_logits_to_keep:
            b.bind_cpu_input(f.logits_to_keep, np.array([n_logits], dtype=np.int64))
        arr, ov = self._logits_out(rows)
        b.bind_ortvalue_output(f.logits, ov)
        self.session.run_with_iobinding(b)
        self.length += s
        self.times.add(s, time.perf_counter() - t0)
        out = arr[0]
        return out[rows - n_logits :] if rows != n_logits else out

    def rewind(self, length: int) -> None:
        """Keeps the first `length` positions. O(1): stale rows are overwritten by the next step."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot rewind a cache of {self.length} tokens to {length}")
        self.length = length

    def reset(self) -> None:
        self.length = 0

