"""One sequence on one cache slot of a ModelRunner (core/runner.py): `Slot`, and `SkipGraph`, a slot of
the layer-skipped self-draft's runner, bound on the target slot's own buffers.

A Slot is a view: its state (length, rotary positions, the last step's hidden rows) is the
runner's per-slot state, its host cache is `arr[b:b+1]` of the runner's buffers, and its steps run
on a binding of that slot's block alone (the whole cache's binding for a one-slot runner, the
engine at --parallel 1, allocating nothing per step beyond the tokens). Everything a single sequence
does runs on any slot: chains, trees + `compact`, rows placed at positions of their own, snapshots
for a pinned prefix, the hidden rows draft heads read, and the self-draft.

Graph contract v2 adds `position_ids` [1, S] and `attention_bias` [1, 1, S, L+S]: a chain step binds
positions L..L+S-1 (a slice of the runner's positions table) and zeros (a view of one reused zero
buffer); `step_tree` binds a tree's per-node positions and its ancestor mask, and `compact` moves
the accepted path's rows to contiguous positions. A version-1 graph lacks both inputs: the slot
then binds neither and runs only chains (`supports_tree`). Contract v3's cuda-flavored graph has
`position_ids` but no `attention_bias` (CUDA's GroupQueryAttention refuses one): each input is bound
only if the graph has it (`contract_inputs`), so such a graph runs chains, never trees.

Graph contract v3 adds the output `hidden_states` [1, n, hidden] (the final normed hidden state of
the n logits rows): when the graph has it, every chain step also fills a reused buffer with it, and
`hidden_row(pos, token)` hands draft heads the row of an earlier position of the last step.

Deterministic mode (`deterministic=True`, docs/runtime.md "Deterministic mode"): onnxruntime's CPU
kernels compute a trailing block of ONE row (a 1-token step, or the last row of a 129-token chunk
for SmolLM2) on another path than rows in blocks of several, and the two round differently (SmolLM2
int8: logits up to 1.3 apart, argmax flips); every other row is bitwise the same whatever the chunking.
So such a step runs one more token, a copy of its last, whose logits are dropped and whose cache
row, past `length`, is never read: every position is computed on the same path, whatever the prefix
cache held or the drafter proposed. The cache gets one spare row for that copy.

The self-draft (drafters/self.py): its graph keeps the target's KV input/output names for the layers
it keeps, and its runner (`runner.skip(session, kept)`, core/runner.py) binds the target's buffers of
those layers to them; `slot.skip(session, kept)` is that runner's slot of the same index. A draft
step at position L writes the kept layers' row L of the target's cache; the verify of the same round
overwrites it (it writes rows L..L+k of every layer). Rows before L are the target's exact ones, so
a draft reads the true past rather than its own approximation of it: nothing to sync, rewind or
prefill. Its weights are the target's (core/shared_weights.py). Its runner's `step(rows)` drafts for
several slots in one pass (engine/draft_batch.py drives it as it drives the draft model's).
"""
from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from ..errors import EdgespecError
from ..models.manifest import ModelFacts
from .steptimes import StepTimes

# deterministic mode: a step of s tokens with s % ROW_BLOCK == 1 gets a copy row. Measured with
# onnxruntime 1.32 on the CPU, the attention computes the last row of a step apart when it is alone
# in a block of 2 x head_dim rows: 33 and 65 tokens (head_dim 16), 129 and 257 (64), 257 (128). 16
# covers every such block of 16 rows or more at no cost to steps of 2-16 tokens.
ROW_BLOCK = 16


def step_rows(s: int, deterministic: bool) -> int:
    """Rows a step of s tokens runs: s, or s + 1 in deterministic mode when its last row would be
    alone in a block (module docstring)."""
    return s + 1 if deterministic and s % ROW_BLOCK == 1 else s


def contract_inputs(facts: ModelFacts, names: set[str]) -> tuple[bool, bool]:
    """(bind position_ids, bind attention_bias): each only when the manifest names it and the graph
    (a session's input names) has it. Every binding asks this one function."""
    return (facts.position_ids is not None and facts.position_ids in names,
            facts.attention_bias is not None and facts.attention_bias in names)


def out_buffer(ort, bufs: dict, key, shape, dtype) -> tuple[np.ndarray, object]:
    """(array, OrtValue over it) of `shape`, made once per `key` in `bufs` and reused: an output a step
    binds is written in place, with no allocation per step (every binding of a runner asks this)."""
    buf = bufs.get(key)
    if buf is None:
        arr = np.empty(shape, dtype=dtype)
        buf = bufs[key] = (arr, ort.OrtValue.ortvalue_from_numpy(arr))
    return buf


class CacheFull(EdgespecError):
    """A step would write past the end of the preallocated cache. Nothing was written."""


class _Graph:
    """One session bound on a slot's buffers: its binding, which contract inputs it reads, and its
    reused output buffers (logits [1, n, V] by n in `logits`, hidden [1, n, H] by n)."""

    def __init__(self, runner, session, binding, logits: dict, hidden: bool):
        f = runner.facts
        names = {i.name for i in session.get_inputs()}
        self.session, self.binding, self.facts, self._ort = session, binding, f, runner.ort
        self.logits_to_keep = f.logits_to_keep is not None and f.logits_to_keep in names
        self.positions, self.bias = contract_inputs(f, names)
        self.hidden = hidden
        self._logits, self._hidden = logits, {}
        self._logits_dtype = runner.logits_dtype

    def run(self, s: int, n_logits: int, drop: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Runs the bound step of s tokens plus `drop` trailing copy rows (deterministic mode):
        (logits [n_logits, V], hidden [n_logits, H] or None) of the last n_logits real tokens, views
        of reused buffers."""
        b, f = self.binding, self.facts
        keep = n_logits + drop
        rows = keep if self.logits_to_keep else s + drop
        if self.logits_to_keep:
            b.bind_cpu_input(f.logits_to_keep, np.array([keep], dtype=np.int64))
        arr, ov = out_buffer(self._ort, self._logits, (1, rows), (1, rows, f.vocab_size), self._logits_dtype)
        b.bind_ortvalue_output(f.logits, ov)
        if self.hidden:
            harr, hov = out_buffer(self._ort, self._hidden, rows, (1, rows, f.hidden_size), np.float32)
            b.bind_ortvalue_output(f.hidden_states, hov)
        self.session.run_with_iobinding(b)
        hidden = harr[0, rows - keep : rows - drop] if self.hidden else None
        return arr[0, rows - keep : rows - drop], hidden


class Slot:
    """Slot `index` of `runner` as one sequence: `step(tokens, n_logits)` appends tokens to the
    slot's cache and returns the last n_logits rows of logits; `rewind(length)` forgets everything
    after `length`. Get it from `runner.slot(b)`.

    Shapes: tokens [S] -> logits [n_logits, vocab]; the slot's host cache buffers
    [1, kv_heads, max_len_rows, head_dim], views of the runner's [N, ...]."""

    def __init__(self, runner, index: int):
        r = self.runner = runner
        b = self.index = index
        self.session, self.facts = r.session, r.facts
        self.max_len, self.max_len_rows, self.vocab_size = r.max_len, r.cache_rows, r.vocab_size
        self.deterministic = r.deterministic
        self.has_hidden = r.has_hidden
        self.times: StepTimes = r.times.table(1)  # a slot's steps are one-row steps
        self._graph = _Graph(r, r.session, r.binding(b, b + 1), r.logits_bufs, r.has_hidden)
        self.supports_tree = self._graph.positions and self._graph.bias
        self._kv_np = None if r.arrays is None else [a[b : b + 1] for a in r.arrays]  # host views
        self._positions = r.positions[b : b + 1]  # [1, rows]: row i's rotary position (a view)
        self._ones = r.ones  # attention_mask is all ones; the graph reads only its width

    @property
    def length(self) -> int:
        """Tokens the slot's cache holds."""
        return self.runner.lengths[self.index]

    @property
    def free(self) -> int:
        """Positions left in the cache."""
        return self.max_len - self.runner.lengths[self.index]

    @property
    def can_tree(self) -> bool:
        """step_tree + compact work: a contract-v2 graph, and a cache on the host (compact copies rows)."""
        return self.supports_tree and self._kv_np is not None

    @property
    def can_place(self) -> bool:
        """Whether rows can be copied in at positions of their own: the graph reads position_ids and
        the cache is on the host."""
        return self._graph.positions and self._kv_np is not None

    def kv_bytes(self) -> int:
        return self.facts.kv_bytes_per_token() * self.max_len_rows

    def skip(self, session, kept: Sequence[int]) -> "SkipGraph":
        """The layer-skipped graph `session` on this slot's buffers of the `kept` layers: this slot of
        the runner's self-draft runner (module docstring)."""
        return self.runner.skip(session, kept).slot(self.index)

    # -- the last chain step's hidden rows (contract v3) --------------------------------------------
    @property
    def hidden(self) -> np.ndarray | None:
        """The hidden rows of the last chain step, [n_logits, hidden] float32 (a view of a reused
        buffer, like the logits), or None (no such output, or the last step was a tree)."""
        h = self.runner.hidden_rows[self.index]
        return None if h is None else h[0]

    def hidden_row(self, pos: int, token: int) -> np.ndarray | None:
        """The final hidden state at cache position `pos` (the state after `token`, which predicts the
        token at pos + 1) if the last chain step computed it and the cache still holds that position
        with that token; else None. [hidden] float32, a view of a reused buffer."""
        h = self.runner.hidden_rows[self.index]
        if h is None or pos >= self.length:
            return None
        rows, first, tokens = h
        j = pos - first
        if not 0 <= j < rows.shape[0] or tokens[j] != token:
            return None
        return rows[j]

    # -- steps ------------------------------------------------------------------------------------
    def step(self, tokens: Sequence[int], n_logits: int = 1, *, position: int | None = None) -> np.ndarray:
        """Runs the graph on `tokens` placed at cache rows [length, length+S) and returns logits of the
        last `n_logits` of them, shape [n_logits, vocab] (a view into a reused buffer: copy it if it
        must outlive the next step). Raises CacheFull, writing nothing, if they do not fit. Their rotary
        positions follow the last row's (rows = positions unless `place` or `position` moved them);
        `position`: the first token's, for rows computed to be placed elsewhere (engine/venue_rows.py)."""
        L = self.length
        out, hidden = self._chain(self._graph, L, tokens, n_logits, position, self.deterministic, self.times)
        s = len(tokens)
        self.runner.lengths[self.index] = L + s
        if hidden is not None:
            self.runner.hidden_rows[self.index] = (hidden, L + s - n_logits,
                                                   [int(t) for t in tokens[s - n_logits :]])
        return out

    def _chain(self, g: _Graph, L: int, tokens: Sequence[int], n_logits: int, position: int | None,
               deterministic: bool, times: StepTimes) -> tuple[np.ndarray, np.ndarray | None]:
        """A chain step of `tokens` at row L on graph g (this slot's, or a SkipGraph's): checks, binds,
        runs; (logits [n_logits, V], hidden rows or None). The caller moves its length."""
        s = len(tokens)
        if s == 0:
            raise ValueError("step needs at least one token")
        if not 1 <= n_logits <= s:
            raise ValueError(f"n_logits must be in [1, {s}], got {n_logits}")
        if L + s > self.max_len:
            raise CacheFull(f"{s} token(s) at position {L} do not fit a cache of {self.max_len}")
        t0 = time.perf_counter()
        ids = np.asarray(tokens, dtype=np.int64)
        n = step_rows(s, deterministic)
        drop = n - s
        if drop:  # the copy row: computed, written past `length`, dropped (module docstring)
            ids = np.concatenate([ids, ids[-1:]])
        b, f = g.binding, self.facts
        b.bind_cpu_input(f.input_ids, ids.reshape(1, n))
        b.bind_cpu_input(f.attention_mask, self._ones[:, : L + n])
        if g.positions:
            if position is not None or self.runner.shifted[self.index]:
                self.runner.set_positions(self.index, L, n, position)
            b.bind_cpu_input(f.position_ids, self._positions[:, L : L + n])
        elif position is not None:
            raise ValueError("this graph has no position_ids input: its rows sit at their own positions")
        if g.bias:
            b.bind_cpu_input(f.attention_bias, self.runner.zero_bias(n, L + n))
        out = g.run(s, n_logits, drop)
        times.add(s, time.perf_counter() - t0)  # under s: what a step of s tokens costs in this mode
        return out

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
        L = self.length
        if L + s > self.max_len:
            raise CacheFull(f"{s} token(s) at position {L} do not fit a cache of {self.max_len}")
        if self.deterministic:
            raise ValueError("tree steps are not part of deterministic mode (a tree's rows round unlike a "
                             "chain's): verify chains")
        t0 = time.perf_counter()
        dtype = self.runner.bias_dtype
        bias = np.zeros((1, 1, s, L + s), dtype=dtype)
        bias[0, 0, :, L:][~anc] = np.finfo(dtype).min / 2  # finite: no inf - inf in the softmax
        pos = (self.runner.next_position(self.index, L) + np.asarray(depths, dtype=np.int64)).reshape(1, s)
        b, f = self._graph.binding, self.facts
        b.bind_cpu_input(f.input_ids, np.asarray(tokens, dtype=np.int64).reshape(1, s))
        b.bind_cpu_input(f.attention_mask, self._ones[:, : L + s])
        b.bind_cpu_input(f.position_ids, pos)
        b.bind_cpu_input(f.attention_bias, bias)
        out, _ = self._graph.run(s, s, 0)
        self.times.add(s, time.perf_counter() - t0)
        self.runner.lengths[self.index] = L + s
        self.runner.hidden_rows[self.index] = None  # a tree's rows are nodes, not positions: no head reads them
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
        if self.runner.shifted[self.index]:  # the path's positions follow the row before it, as a chain's would
            self.runner.set_positions(self.index, start, len(rows), None)

    # -- rows at positions of their own (engine/venue_rows.py), snapshots (engine/pinned.py) ---------
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
        L = self.length
        if L + m > self.max_len:
            raise CacheFull(f"{m} placed row(s) at row {L} do not fit a cache of {self.max_len}")
        for arr, r in zip(self._kv_np, rows):
            arr[:, :, L : L + m] = r
        self._positions[0, L : L + m] = positions
        self.runner.shifted[self.index] = True
        self.runner.lengths[self.index] = L + m
        self.runner.hidden_rows[self.index] = None

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
        self.runner.reset(self.index)
        self.runner.lengths[self.index] = n  # the hidden rows it held belong to another context: reset dropped them

    def rewind(self, length: int) -> None:
        """Keeps the first `length` positions. O(1): stale rows are overwritten by the next step."""
        self.runner.rewind(self.index, length)

    def reset(self) -> None:
        self.runner.reset(self.index)


class SkipGraph(Slot):
    """Slot `index` of a self-draft's runner (ModelRunner.skip): the layer-skipped graph on the target
    slot's own KV buffers, kept layers only (module docstring).

    `length` is where the next draft step writes; the drafter sets it to the target's length
    before each proposal (rows at and past the target's length belong to nobody until the verify
    writes them). Its steps are chains at the target slot's positions, never deterministic-mode
    copies (the verify decides every token). It trees, places, snapshots and compacts nothing: the
    cache is the target's."""

    def __init__(self, runner, index: int):
        super().__init__(runner, index)
        self.target = runner.target.slot(index)  # the target's slot whose buffers it drafts on
        self.kept = runner.layers
        self.supports_tree, self._kv_np = False, None  # no trees, placed rows, snapshots or compaction

    def _set_length(self, n: int) -> None:
        self.runner.lengths[self.index] = int(n)

    length = Slot.length.setter(_set_length)

    def kv_bytes(self) -> int:
        return 0  # the target's buffers
