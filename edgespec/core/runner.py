"""One model, one onnxruntime session, one KV cache allocated once and written in place.

The graph (docs/graph-contract.md) takes `past_key_values.{i}.key|value` of shape
[1, kv_heads, MAX, head_dim] and returns `present.{i}.key|value` of the same shape. Binding both to
the *same* OrtValue makes GroupQueryAttention write the new rows into the buffer we own, so a step
allocates and copies no cache. The cache length L is just a number we keep: the graph learns it from
the width of `attention_mask` (L + S), and rewinding is setting L back, since rows past L are never
read and are overwritten by the next step.

Graph contract v2 adds `position_ids` [1, S] and `attention_bias` [1, 1, S, L+S]: a chain step binds
positions L..L+S-1 (a slice of one preallocated arange) and zeros (a view of one preallocated zero
buffer), so it allocates nothing more than before; `step_tree` binds a tree's per-node positions and
its ancestor mask, and `compact` moves the accepted path's rows to contiguous positions. A version-1
graph lacks both inputs: the runner then binds neither and can only run chains (`supports_tree`).

Graph contract v3 adds the output `hidden_states` [1, n, hidden] (the final normed hidden state of
the n logits rows): when the graph has it, every chain step also fills a reused buffer with it, and
`hidden_row(pos, token)` hands draft heads the row of an earlier position of the last step.

Contract v3's cuda-flavored graph has `position_ids` but no `attention_bias` (CUDA's
GroupQueryAttention refuses one): the runner binds each input only if the graph has it
(`contract_inputs`), so such a graph runs chains, never trees.

Deterministic mode (`deterministic=True`, docs/runtime.md "Deterministic mode"): onnxruntime's CPU
kernels compute a trailing block of ONE row (a 1-token step, or the last row of a 129-token chunk
for SmolLM2) on another path than rows in blocks of several, and the two round differently (SmolLM2
int8: logits up to 1.3 apart, argmax flips); every other row is bitwise the same whatever the chunking.
So such a step runs one more token, a copy of its last, whose logits are dropped and whose cache
row, past `length`, is never read: every position is computed on the same path, whatever the prefix
cache held or the drafter proposed. The cache gets one spare row for that copy.
"""
from __future__ import annotations

import logging
import time
from typing import Sequence

import numpy as np

from ..errors import EdgespecError
from ..models.manifest import ModelFacts
from .dtypes import NP_DTYPES as _NP_DTYPES
from .steptimes import StepTimes

_ZERO_BIAS_CAP = 1 << 16  # elements of the reused zero bias (256 KB in fp32): decode/verify steps
# deterministic mode: a step of s tokens with s % ROW_BLOCK == 1 gets a copy row. Measured with
# onnxruntime 1.32 on the CPU, the attention computes the last row of a step apart when it is alone
# in a block of 2 x head_dim rows: 33 and 65 tokens (head_dim 16), 129 and 257 (64), 257 (128). 16
# covers every such block of 16 rows or more at no cost to steps of 2-16 tokens.
ROW_BLOCK = 16
log = logging.getLogger("edgespec.runner")


def step_rows(s: int, deterministic: bool) -> int:
    """Rows a step of s tokens runs: s, or s + 1 in deterministic mode when its last row would be
    alone in a block (module docstring)."""
    return s + 1 if deterministic and s % ROW_BLOCK == 1 else s


def contract_inputs(facts: ModelFacts, names: set[str]) -> tuple[bool, bool]:
    """(bind position_ids, bind attention_bias): each only when the manifest names it and the graph
    (a session's input names) has it. Every runner asks this one function."""
    return (facts.position_ids is not None and facts.position_ids in names,
            facts.attention_bias is not None and facts.attention_bias in names)


class CacheFull(EdgespecError):
    """A step would write past the end of the preallocated cache. Nothing was written."""


class ModelRunner:
    """`step(tokens, n_logits)` appends tokens to the cache and returns the last n_logits rows of
    logits; `rewind(length)` forgets everything after `length`.

    Shapes: tokens [S] -> logits [n_logits, vocab]; cache buffers [1, kv_heads, max_len, head_dim]
    (max_len + 1 in deterministic mode).
    """

    # contract v3's hidden output: off unless __init__ finds it (subclasses that bind their own
    # graph, like the self-draft's SelfRunner, never fill it)
    has_hidden = False
    _hidden: np.ndarray | None = None
    _last_tokens: Sequence[int] = ()
    deterministic = False  # class default: a subclass with its own __init__ (the self-draft) is not
    # True once rows sit at positions of their own (place, step(position=)); reset() and restore() clear it.
    # A class default: the self-draft's own __init__ sets none, and its steps follow the positions array it shares
    _shifted = False

    def __init__(self, session, facts: ModelFacts, max_len: int, *, device: str = "cpu", device_id: int = 0,
                 deterministic: bool = False):
        import onnxruntime as ort

        if max_len < 2:
            raise ValueError(f"max_len must be at least 2, got {max_len}")
        self.session = session
        self.deterministic = bool(deterministic)
        rows = self.max_len_rows = int(max_len) + (1 if deterministic else 0)  # + a spare row for a copy
        self.facts = facts
        self.max_len = int(max_len)
        self.length = 0  # tokens currently held in the cache
        self.times = StepTimes()
        self.vocab_size = facts.vocab_size
        inputs = {i.name for i in session.get_inputs()}
        self._has_logits_to_keep = facts.logits_to_keep is not None and facts.logits_to_keep in inputs
        # contract v2/v3: per-token positions (v2, and v3 in both flavors) and the attention bias (v2, and
        # v3's cpu flavor); trees need both: False for a version-1 graph and a v3 cuda graph
        self._bind_positions, self._bind_bias = contract_inputs(facts, inputs)
        self.supports_tree = self._bind_positions and self._bind_bias
        kv_dtype = _NP_DTYPES[facts.kv_dtype]
        self._bias_dtype = kv_dtype  # GQA's attention_bias has the attention's float type (= the cache's)
        self._positions = np.arange(rows, dtype=np.int64).reshape(1, rows)  # row i's rotary position
        self._zeros = np.zeros(0, dtype=kv_dtype)  # grown on demand up to _ZERO_BIAS_CAP elements
        self._kv_np: list[np.ndarray] | None = [] if device == "cpu" else None  # host views for compact()
        shape = (1, facts.kv_heads, rows, facts.head_dim)
        self._kv: list = []  # OrtValues, in binding order: (key_0, value_0, key_1, ...)
        for _ in range(facts.layers):
            for _ in ("key", "value"):
                if device == "cpu":
                    arr = np.zeros(shape, dtype=kv_dtype)
                    self._kv_np.append(arr)  # the OrtValue wraps this memory: writes show here
                    ov = ort.OrtValue.ortvalue_from_numpy(arr)
                else:
                    ov = ort.OrtValue.ortvalue_from_shape_and_type(list(shape), kv_dtype, device, device_id)
                self._kv.append(ov)
        # attention_mask is all ones; the graph reads only its width. One buffer, sliced per step.
        self._ones = np.ones((1, rows), dtype=np.int64)
        self._logits_dtype = _NP_DTYPES[facts.logits_dtype]
        self._logits_bufs: dict[int, tuple[np.ndarray, object]] = {}  # n_logits -> (array, OrtValue)
        # contract v3: the hidden state of the logits rows, [1, n, hidden] float32, a reused buffer per n
        outputs = {o.name for o in session.get_outputs()}
        self.has_hidden = facts.hidden_states is not None and facts.hidden_states in outputs
        self._hidden_bufs: dict[int, tuple[np.ndarray, object]] = {}
        # the last step's hidden rows: row j is cache position _hidden_pos + j, fed token _hidden_tokens[j]
        self._hidden: np.ndarray | None = None
        self._hidden_pos = 0
        self._hidden_tokens: list[int] = []
        self._last_tokens: Sequence[int] = ()
        self._binding = session.io_binding()
        for i in range(facts.layers):
            k, v = self._kv[2 * i], self._kv[2 * i + 1]
            self._binding.bind_ortvalue_input(facts.past_key % i, k)
            self._binding.bind_ortvalue_input(facts.past_value % i, v)
            self._binding.bind_ortvalue_output(facts.present_key % i, k)
            self._binding.bind_ortvalue_output(facts.present_value % i, v)
        self._ort = ort

    @property
    def can_tree(self) -> bool:
        """step_tree + compact work: a contract-v2 graph, and a cache on the host (compact copies rows)."""
        return self.supports_tree and self._kv_np is not None

    @property
    def free(self) -> int:
        """Positions left in the cache."""
        return self.max_len - self.length

    def kv_bytes(self) -> int:
        return self.facts.kv_bytes_per_token() * self.max_len_rows

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

    @property
    def hidden(self) -> np.ndarray | None:
        """The hidden rows of the last chain step, [n_logits, hidden] float32 (a view of a reused
        buffer, like the logits), or None (no such output, or the last step was a tree)."""
        return self._hidden

    def hidden_row(self, pos: int, token: int) -> np.ndarray | None:
        """The final hidden state at cache position `pos` (the state after `token`, which predicts the
        token at pos + 1) if the last chain step computed it and the cache still holds that position
        with that token; else None. [hidden] float32, a view of a reused buffer."""
        h = self._hidden
        if h is None or pos >= self.length:
            return None
        j = pos - self._hidden_pos
        if not 0 <= j < h.shape[0] or self._hidden_tokens[j] != token:
            return None
        return h[j]

    def step(self, tokens: Sequence[int], n_logits: int = 1, *, position: int | None = None) -> np.ndarray:
        """Runs the graph on `tokens` placed at cache rows [length, length+S) and returns logits of the
        last `n_logits` of them, shape [n_logits, vocab] (a view into a reused buffer: copy it if it
        must outlive the next step). Raises CacheFull, writing nothing, if they do not fit. Their rotary
        positions follow the last row's (rows = positions unless `place` or `position` moved them);
        `position`: the first token's, for rows computed to be placed elsewhere (engine/venue_rows.py)."""
        s = len(tokens)
        if s == 0:
            raise ValueError("step needs at least one token")
        if not 1 <= n_logits <= s:
            raise ValueError(f"n_logits must be in [1, {s}], got {n_logits}")
        if self.length + s > self.max_len:
            raise CacheFull(f"{s} token(s) at position {self.length} do not fit a cache of {self.max_len}")
        t0 = time.perf_counter()
        ids = np.asarray(tokens, dtype=np.int64)
        n = step_rows(s, self.deterministic)
        drop = n - s
        if drop:  # the copy row: computed, written past `length`, dropped (module docstring)
            ids = np.concatenate([ids, ids[-1:]])
        b = self._binding
        f = self.facts
        self._last_tokens = tokens
        b.bind_cpu_input(f.input_ids, ids.reshape(1, n))
        b.bind_cpu_input(f.attention_mask, self._ones[:, : self.length + n])
        if self._bind_positions:
            L = self.length
            if position is not None or self._shifted:
                self._set_positions(L, n, position)
            b.bind_cpu_input(f.position_ids, self._positions[:, L : L + n])
        elif position is not None:
            raise ValueError("this graph has no position_ids input: its rows sit at their own positions")
        if self._bind_bias:
            b.bind_cpu_input(f.attention_bias, self._zero_bias(n, self.length + n))
        return self._run(s, n_logits, t0, drop)

    def _zero_bias(self, s: int, total: int) -> np.ndarray:
        """A zero attention bias [1, 1, s, total]: a contiguous view of one reused zero buffer (a
        chain step needs no mask beyond GQA's own causal one)."""
        n = s * total
        if n > self._zeros.size:
            if n > _ZERO_BIAS_CAP:  # a long prefill chunk: a one-off array, not kept
                return np.zeros((1, 1, s, total), dtype=self._bias_dtype)
            self._zeros = np.zeros(min(_ZERO_BIAS_CAP, max(n, 2 * self._zeros.size, 4096)), dtype=self._bias_dtype)
        return self._zeros[:n].reshape(1, 1, s, total)

    def step_tree(self, tokens: Sequence[int], depths: Sequence[int], ancestors: np.ndarray) -> np.ndarray:
        """Runs a flattened tree of N nodes placed at cache rows [length, length+N): node i at rotary
        position length + depths[i], attending to the whole cache before it and to the nodes j with
        ancestors[i, j] (itself and its ancestors; ancestors is bool [N, N], lower triangular: a
        parent precedes its children). Returns logits [N, vocab] (a reused buffer, like step).
        `length` grows by N; the caller keeps the accepted path with `compact` and `rewind`."""
        if not self.supports_tree:
            raise ValueError("this graph has no position_ids/attention_bias inputs (a format-1 bundle, or a "
                             "cuda-flavored graph): trees run on a cpu-flavored graph of format 2 or later")
        s = len(tokens)
        if s == 0:
            raise ValueError("step_tree needs at least one token")
        anc = np.asarray(ancestors, dtype=bool)
        if anc.shape != (s, s) or len(depths) != s:
            raise ValueError(f"a tree of {s} nodes needs depths [{s}] and ancestors [{s}, {s}], got "
                             f"{len(depths)} and {anc.shape}")
        if self.length + s > self.max_len:
            raise CacheFull(f"{s} token(s) at position {self.length} do not fit a cache of {self.max_len}")
        if self.deterministic:
            raise ValueError("tree steps are not part of deterministic mode (a tree's rows round unlike a "
                             "chain's): verify chains")
        t0 = time.perf_counter()
        L = self.length
        bias = np.zeros((1, 1, s, L + s), dtype=self._bias_dtype)
        bias[0, 0, :, L:][~anc] = np.finfo(self._bias_dtype).min / 2  # finite: no inf - inf in the softmax
        pos = (self._next_position(L) + np.asarray(depths, dtype=np.int64)).reshape(1, s)
        b = self._binding
        f = self.facts
        self._last_tokens = tokens
        b.bind_cpu_input(f.input_ids, np.asarray(tokens, dtype=np.int64).reshape(1, s))
        b.bind_cpu_input(f.attention_mask, self._ones[:, : L + s])
        b.bind_cpu_input(f.position_ids, pos)
        b.bind_cpu_input(f.attention_bias, bias)
        out = self._run(s, s, t0)
        self._hidden = None  # a tree's rows are nodes, not positions: no head reads them
        return out

    def compact(self, rows: Sequence[int], start: int) -> None:
        """Copies the K/V of cache rows `rows` (ascending, each >= start) to rows start, start+1, ...
        in every layer: after a tree verify, the accepted path's rows become contiguous, so the
        cache again holds exactly the context. Rows already in place are not copied."""
        rows = list(rows)
        moves = [(src, start + j) for j, src in enumerate(rows) if src != start + j]
        if not moves:
            return
        if any(src < dst for src, dst in moves) or rows != sorted(rows) or rows[-1] >= self.length:
            raise ValueError(f"compact: rows {rows} to {start} are not an ascending path inside the cache")
        if self._kv_np is None:
            raise ValueError("compacting the cache is implemented for the CPU provider only")
        src = np.array([m[0] for m in moves])
        dst = np.array([m[1] for m in moves])
        for arr in self._kv_np:
            arr[0, :, dst] = arr[0, :, src]  # fancy indexing reads a copy first: overlaps are safe
        if self._shifted:  # the path's positions follow the row before it, as a chain's would
            self._set_positions(start, len(rows), None)

    # -- rows at positions of their own (engine/venue_rows.py: a venue's passages computed once) --------
    def _next_position(self, row: int) -> int:
        return int(self._positions[0, row - 1]) + 1 if row and self._shifted else row

    def _set_positions(self, row: int, n: int, first: int | None) -> None:
        """Rows [row, row+n) at positions first.. (None: after row - 1's), and the runner remembers
        that its rows and positions may differ from here on."""
        p0 = self._next_position(row) if first is None else int(first)
        self._positions[0, row : row + n] = np.arange(p0, p0 + n, dtype=np.int64)
        self._shifted = True

    @property
    def can_place(self) -> bool:
        """Whether rows can be copied in at positions of their own: the graph reads position_ids and
        the cache is on the host."""
        return self._bind_positions and self._kv_np is not None

    def rows(self, start: int, end: int) -> tuple[list[np.ndarray], np.ndarray]:
        """Copies of cache rows [start, end) of every buffer (each [1, kv_heads, end-start, head_dim])
        and their positions [end-start]."""
        if self._kv_np is None or not 0 <= start < end <= self.length:
            raise ValueError(f"rows: [{start}, {end}) is not inside a host cache of {self.length} rows")
        return [arr[:, :, start:end].copy() for arr in self._kv_np], self._positions[0, start:end].copy()

    def place(self, rows: Sequence[np.ndarray], positions: np.ndarray) -> None:
        """Appends rows computed elsewhere (`rows`) at their positions: the cache grows by their length,
        and the next step's tokens follow the last of them."""
        m = len(positions)
        if not self.can_place:
            raise ValueError("place: this graph has no position_ids input, or its cache is not on the host")
        self.check_rows(rows, m)
        if self.length + m > self.max_len:
            raise CacheFull(f"{m} placed row(s) at row {self.length} do not fit a cache of {self.max_len}")
        L = self.length
        for arr, r in zip(self._kv_np, rows):
            arr[:, :, L : L + m] = r
        self._positions[0, L : L + m] = positions
        self._shifted = True
        self.length = L + m
        self._hidden = None

    def check_rows(self, rows: Sequence[np.ndarray], m: int) -> None:
        """ValueError unless `rows` are m rows of every buffer of this host cache (its heads, head size,
        dtype): what restore and place write."""
        if self._kv_np is None or len(rows) != len(self._kv_np):
            raise ValueError("these rows are not this cache's: it is not on the host, or they have another "
                             "number of buffers")
        for arr, r in zip(self._kv_np, rows):
            want = (1, arr.shape[1], m, arr.shape[3])
            if r.shape != want or r.dtype != arr.dtype:
                raise ValueError(f"a row block {r.shape} {r.dtype} is not {want} {arr.dtype}")

    def _unshift(self) -> None:
        if self._shifted:
            self._positions[0] = np.arange(self._positions.shape[1], dtype=np.int64)
            self._shifted = False

    def snapshot(self, n: int) -> list[np.ndarray] | None:
        """Copies of the first n rows of every cache buffer (key_0, value_0, key_1, ...; each
        [1, kv_heads, n, head_dim]), for a prefix kept aside (engine/pinned.py); None when the cache
        is not on the host."""
        if self._kv_np is None or not 0 < n <= self.length:
            return None
        return self.rows(0, n)[0]

    def restore(self, rows: Sequence[np.ndarray]) -> None:
        """Writes a snapshot back as the cache's first rows; the cache then holds exactly them."""
        n = rows[0].shape[2] if len(rows) else 0
        self.check_rows(rows, n)
        if n > self.max_len:
            raise ValueError(f"restore: a snapshot of {n} rows does not fit a cache of {self.max_len}")
        for arr, r in zip(self._kv_np, rows):
            arr[:, :, :n] = r
        self._unshift()
        self.length = n
        self._hidden = None  # the rows it held belong to another context

    def _run(self, s: int, n_logits: int, t0: float, drop: int = 0) -> np.ndarray:
        """Runs the bound step of s tokens plus `drop` trailing copy rows (deterministic mode) and
        returns the logits of the last n_logits real tokens. The copies' cache rows lie past
        `length`: never read, overwritten by the next step. Times are kept under s: what a step of
        s tokens costs in this mode."""
        b = self._binding
        f = self.facts
        keep = n_logits + drop
        rows = keep if self._has_logits_to_keep else s + drop
        if self._has_logits_to_keep:
            b.bind_cpu_input(f.logits_to_keep, np.array([keep], dtype=np.int64))
        arr, ov = self._logits_out(rows)
        b.bind_ortvalue_output(f.logits, ov)
        if self.has_hidden:
            harr, hov = self._hidden_out(rows)
            b.bind_ortvalue_output(f.hidden_states, hov)
        self.session.run_with_iobinding(b)
        start = self.length
        self.length += s
        self.times.add(s, time.perf_counter() - t0)
        if self.has_hidden:
            self._hidden = harr[0, rows - keep : rows - drop]
            self._hidden_pos = start + s - n_logits
            self._hidden_tokens = [int(t) for t in self._last_tokens[s - n_logits :]]
        out = arr[0]
        return out[rows - keep : rows - drop]

    def _hidden_out(self, n_rows: int):
        buf = self._hidden_bufs.get(n_rows)
        if buf is None:
            arr = np.empty((1, n_rows, self.facts.hidden_size), dtype=np.float32)
            buf = (arr, self._ort.OrtValue.ortvalue_from_numpy(arr))
            self._hidden_bufs[n_rows] = buf
        return buf

    def rewind(self, length: int) -> None:
        """Keeps the first `length` positions. O(1): stale rows are overwritten by the next step."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot rewind a cache of {self.length} tokens to {length}")
        self.length = length

    def reset(self) -> None:
        self._unshift()
        self.length = 0
        self._hidden = None

