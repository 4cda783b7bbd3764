"""One model, one onnxruntime session, one KV cache with a slot per sequence, allocated once and
written in place.

The graph (docs/graph-contract.md) takes `past_key_values.{i}.key|value` of shape
[N, kv_heads, MAX, head_dim] and returns `present.{i}.key|value` of the same shape. Binding both to
the *same* memory makes GroupQueryAttention write the new rows into the buffer we own, so a step
allocates and copies no cache. A slot's length L_b is just a number we keep: the graph learns it from
the attention mask, and rewinding is setting it back, since rows past L_b are never read and are
overwritten by the next step. The buffers are slot-major, so slots [lo, hi) are one contiguous block:
a step of some slots binds that block by its address (CPU and GPU alike) and pays for those rows only.

One sequence runs on a slot through its view, `runner.slot(b)` (core/slot.py: chains, trees,
placed rows, snapshots, hidden rows). Slot 0 of a one-slot runner (the engine at --parallel 1)
binds the whole cache.

The self-draft (drafters/self.py) is a runner too: `runner.skip(session, kept)` is the layer-skipped
graph over this runner's cache, the `kept` layers' buffers bound to its own KV names, with lengths of
its own (where each slot's next draft step writes) and the target's rotary positions. Its slots are
core/slot.SkipGraph views; its `step(rows)` drafts for several slots in one pass, as the draft
model's does (engine/draft_batch.py). A slot of its block that drafts nothing in a pass sits at its
target's length: on a graph without the padded-queries edit its padding is written there, past
what the target holds, never over a row it reads.

A batched step (`step(rows)`) feeds every slot of the block the same number S of input tokens: slot
b's real tokens (s_b of them, 0 for an idle slot) right-padded to S. The graph learns which tokens are
real from the attention mask (export/graph_batch.py, "padded queries"):

    mask[b] = 1 x (L_b + s_b), then one cell holding -(S - s_b) when the row is padded, then zeros

so GroupQueryAttention reads L_b cached rows, writes s_b new ones at [L_b, L_b + s_b) and leaves the
slot's other rows alone; an idle slot (s_b = 0) is unchanged.

Without that edit (the cuda flavor, whose onnxruntime-gpu releases have no query_seqlens; a cpu graph
loaded by an onnxruntime older than 1.32.0, models/ortcompat.py) GroupQueryAttention refuses a pass of
several rows of several tokens over a cache (kernels.BATCH_SOURCE). Such a graph still serves several
sequences: a step where every row has one token is one pass, each row padded to that one token (an
idle slot's padding is written at its own length and the slot is rewound to it: those positions are
never read); a step with a longer row runs each row alone on its slot's view. The same kernels and
shapes as a single sequence's: batched output equals batch-1 output.

Deterministic mode (`deterministic=True`, core/slot.py): a row whose last real token would be
computed alone (step_rows: 1 token, or 17, 33, ...) gets a copy of it as one more real token, written
past the slot's length, its logits dropped; rows do not depend on the other rows of the pass nor on
their padding (measured, docs/runtime.md). The cache gets one spare position per slot for the copy,
and, with several slots, one more: a full row padded in a batched step needs a mask one wider than
the cache (its padding mark's cell).

Shapes: cache buffers [N, kv_heads, cache_rows, head_dim]; `step(rows)` rows {slot: tokens [s_b]} ->
{slot: logits [s_b, V]} (copies); a slot's `step(tokens, n_logits)` -> [n_logits, V] (a view of a
reused buffer).
"""
from __future__ import annotations

import logging
import time
from typing import Mapping, Sequence

import numpy as np

from ..models.manifest import ModelFacts
from ..models.ortcompat import PADDED_QUERIES_KEY
from .dtypes import NP_DTYPES
from .slot import CacheFull, SkipGraph, Slot, contract_inputs, out_buffer, step_rows
from .steptimes import BatchTimes, StepTimes

__all__ = ["BatchTimes", "CacheFull", "ModelRunner", "Slot", "StepTimes", "graph_batches", "step_rows"]

_ZERO_BIAS_CAP = 1 << 16  # elements of the reused zero bias (256 KB in fp32): decode/verify steps
log = logging.getLogger("edgespec.runner")


def _why_per_row(facts: ModelFacts, version: str) -> str:
    """One line: why this graph verifies a batch a pass per row, and what would make it one pass."""
    from ..models.ortcompat import BATCH_ORT, missing_inputs

    if facts.graph_flavor() == "cuda":
        return ("the cuda flavor's GroupQueryAttention takes no per-row query lengths (query_seqlens is in no "
                "onnxruntime-gpu release)")
    if "query_seqlens" in missing_inputs().values():
        return (f"onnxruntime {version} has no GroupQueryAttention query_seqlens: onnxruntime {BATCH_ORT} or newer "
                f"verifies the batch in one pass")
    return f"{facts.path} was exported before the batching edit: re-export it with this edgespec for one pass"


def _cache(ort, shape: tuple[int, ...], dtype, device: str, device_id: int, n: int) -> tuple[list | None, list]:
    """n zeroed cache buffers of `shape`: (host arrays or None off the CPU, their OrtValues in binding
    order: key_0, value_0, key_1, ...)."""
    if device != "cpu":
        return None, [ort.OrtValue.ortvalue_from_shape_and_type(list(shape), dtype, device, device_id) for _ in range(n)]
    arrays = [np.zeros(shape, dtype=dtype) for _ in range(n)]  # host buffers (OrtValues wrap them)
    return arrays, [ort.OrtValue.ortvalue_from_numpy(a) for a in arrays]


def graph_batches(session) -> bool:
    """Whether the graph marks padded queries (export/graph_batch.py): needed for N > 1 slots."""
    try:
        meta = session.get_modelmeta().custom_metadata_map
    except Exception:  # noqa: BLE001 - a provider without metadata: treat as old graph
        return False
    return meta.get(PADDED_QUERIES_KEY) == "1"


class ModelRunner:
    """A model with `slots` cache slots: `step(rows)` runs every given slot's tokens in one pass,
    `slot(b)` is slot b as one sequence (core/slot.py). Per slot it keeps the length, the rotary
    position of every row (`positions`, [N, cache_rows]: rows = positions until rows are placed at
    positions of their own, `shifted`) and the last chain step's hidden rows (a batched pass's too:
    every row of the slot, as its own chain step would store them)."""

    def __init__(self, session, facts: ModelFacts, max_len: int, slots: int = 1, *, device: str = "cpu",
                 device_id: int = 0, deterministic: bool = False, target: ModelRunner | None = None,
                 layers: Sequence[int] | None = None):
        """target, layers: the self-draft's (`skip`): its graph runs on target's cache, `layers` of it."""
        import onnxruntime as ort

        if max_len < 2:
            raise ValueError(f"max_len must be at least 2, got {max_len}")
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise ValueError(f"slots must be an integer >= 1, got {slots!r}")
        # whether a step of several multi-token rows is one pass (the padded-queries edit), or a pass per row
        self.one_pass = slots == 1 or graph_batches(session)
        self.target = target  # the runner whose cache this one's graph runs on (the self-draft's), or None
        self.layers = None if layers is None else list(layers)  # the cache layers its graph binds (None: all)
        if not self.one_pass and target is None:
            log.info("batched verify runs a pass per row: %s", _why_per_row(facts, ort.__version__))
        self.ort = ort
        self.session, self.facts, self.slots = session, facts, slots
        self.device, self.device_id = device, int(device_id)
        self.max_len = int(max_len)
        self.vocab_size = facts.vocab_size
        self.deterministic = bool(deterministic)
        self.times = BatchTimes()
        names = {i.name for i in session.get_inputs()}
        self.has_logits_to_keep = facts.logits_to_keep is not None and facts.logits_to_keep in names
        # contract v2/v3: per-token positions and the attention bias (v3 cuda has no bias: core/slot.py)
        self.bind_positions, self.bind_bias = contract_inputs(facts, names)
        self.has_hidden = target is None and facts.hidden_states is not None and facts.hidden_states in {
            o.name for o in session.get_outputs()}  # a self-draft's rows are drafts: no head reads them
        kv_dtype = NP_DTYPES[facts.kv_dtype]
        self.bias_dtype = kv_dtype  # GQA's attention_bias has the attention's float type (= the cache's)
        self.logits_dtype = NP_DTYPES[facts.logits_dtype]
        if target is None:
            # a spare row for a padded full row's mark (several slots), one for a copy (deterministic mode)
            rows = self.cache_rows = self.max_len + (1 if slots > 1 else 0) + (1 if deterministic else 0)
            self.arrays, self.kv = _cache(ort, (slots, facts.kv_heads, rows, facts.head_dim), kv_dtype, device,
                                          device_id, facts.layers * 2)
            self.positions = np.tile(np.arange(rows, dtype=np.int64), (slots, 1))  # [N, rows]: each row's position
            self.shifted = [False] * slots  # rows and positions may differ (place, step(position=))
        else:  # the target's buffers and positions (the same objects): a draft step follows its slot's rows
            rows = self.cache_rows = target.cache_rows
            self.arrays, self.kv, self.positions, self.shifted = target.arrays, target.kv, target.positions, target.shifted
        # per-slot state
        self.lengths = [0] * slots  # tokens each slot's cache holds (the self-draft's: where its next step writes)
        self.hidden_rows: list[tuple[np.ndarray, int, list[int]] | None] = [None] * slots  # (rows, first pos, tokens)
        self.ones = np.ones((1, rows), dtype=np.int64)  # a one-row step's attention_mask, sliced per step
        self._zeros = np.zeros(0, dtype=kv_dtype)  # grown on demand up to _ZERO_BIAS_CAP elements
        self.logits_bufs: dict[tuple[int, int], tuple[np.ndarray, object]] = {}  # (rows, n) -> (array, OrtValue)
        self.hidden_bufs: dict[tuple[int, int], tuple[np.ndarray, object]] = {}  # the batched pass's hidden rows
        self._bindings: dict[tuple[int, int], object] = {}
        self._views: dict[int, Slot] = {}
        self._skips: dict[tuple[int, tuple[int, ...]], ModelRunner] = {}

    # -- bindings ---------------------------------------------------------------------------------
    def binding(self, lo: int, hi: int, *, session=None, layers: Sequence[int] | None = None):
        """A binding of slots [lo, hi) of the cache (the runner's own, kept; or, given `session`, a new
        one for that graph over `layers` only: the self-draft). The whole cache is bound as its
        OrtValues; a block of it by address: slot-major buffers make it contiguous, so a step pays
        for hi - lo slots and writes in place."""
        if session is None:
            b = self._bindings.get((lo, hi))
            if b is None:
                b = self._bindings[(lo, hi)] = self.binding(lo, hi, session=self.session, layers=self.layers)
            return b
        f = self.facts
        b = session.io_binding()
        shape = [hi - lo, f.kv_heads, self.cache_rows, f.head_dim]
        dtype = NP_DTYPES[f.kv_dtype]
        per_slot = f.kv_heads * self.cache_rows * f.head_dim * np.dtype(dtype).itemsize
        names = [(f.past_key, f.present_key), (f.past_value, f.present_value)]
        for i in range(f.layers) if layers is None else layers:
            for j, (past, present) in enumerate(names):
                ov = self.kv[2 * i + j]
                if (lo, hi) == (0, self.slots):
                    b.bind_ortvalue_input(past % i, ov)
                    b.bind_ortvalue_output(present % i, ov)
                else:
                    addr = ov.data_ptr() + lo * per_slot
                    b.bind_input(past % i, self.device, self.device_id, dtype, shape, addr)
                    b.bind_output(present % i, self.device, self.device_id, dtype, shape, addr)
        return b

    def slot(self, b: int) -> Slot:
        """Slot b as one sequence (core/slot.py; a self-draft's: a SkipGraph), made once."""
        if not 0 <= b < self.slots:
            raise ValueError(f"slot {b} is not in [0, {self.slots})")
        v = self._views.get(b)
        if v is None:
            v = self._views[b] = Slot(self, b) if self.target is None else SkipGraph(self, b)
        return v

    def skip(self, session, kept: Sequence[int]) -> ModelRunner:
        """The layer-skipped graph `session` over this runner's cache, its `kept` layers (the
        self-draft: module docstring), as a runner of as many slots; made once per session and layers."""
        key = (id(session), tuple(kept))
        r = self._skips.get(key)
        if r is None:  # it holds the session: the key's id stays its own
            r = self._skips[key] = ModelRunner(session, self.facts, self.max_len, self.slots, device=self.device,
                                               device_id=self.device_id, target=self, layers=kept)
        return r

    def pass_range(self, slots) -> tuple[int, int]:
        """The slots [lo, hi) a pass over these active slots runs: the block from the lowest to the
        highest (the idle ones between them included)."""
        return min(slots), max(slots) + 1

    def zero_bias(self, s: int, total: int) -> np.ndarray:
        """A zero attention bias [1, 1, s, total]: a contiguous view of one reused zero buffer (a
        chain step needs no mask beyond GQA's own causal one)."""
        n = s * total
        if n > self._zeros.size:
            if n > _ZERO_BIAS_CAP:  # a long prefill chunk: a one-off array, not kept
                return np.zeros((1, 1, s, total), dtype=self.bias_dtype)
            self._zeros = np.zeros(min(_ZERO_BIAS_CAP, max(n, 2 * self._zeros.size, 4096)), dtype=self.bias_dtype)
        return self._zeros[:n].reshape(1, 1, s, total)

    # -- per-slot state ----------------------------------------------------------------------------
    def rewind(self, slot: int, length: int) -> None:
        """Keeps the slot's first `length` positions (O(1): stale rows are never read)."""
        if not 0 <= length <= self.lengths[slot]:
            raise ValueError(f"cannot rewind a cache of {self.lengths[slot]} tokens to {length}")
        self.lengths[slot] = length

    def reset(self, slot: int | None = None) -> None:
        """Empties a slot (every slot when None): length 0, rows at their own positions, no hidden rows."""
        for s in range(self.slots) if slot is None else (slot,):
            self.lengths[s] = 0
            self.hidden_rows[s] = None
            if self.shifted[s] and self.target is None:  # a self-draft's positions are its target's
                self.positions[s] = np.arange(self.cache_rows, dtype=np.int64)
                self.shifted[s] = False

    def next_position(self, slot: int, row: int) -> int:
        """The rotary position of a chain token at `row`: one past the row before it."""
        return int(self.positions[slot, row - 1]) + 1 if row and self.shifted[slot] else row

    def set_positions(self, slot: int, row: int, n: int, first: int | None) -> None:
        """Rows [row, row+n) at positions first.. (None: after row - 1's); the slot's rows and
        positions may differ from here on."""
        p0 = self.next_position(slot, row) if first is None else int(first)
        self.positions[slot, row : row + n] = np.arange(p0, p0 + n, dtype=np.int64)
        self.shifted[slot] = True

    def warmup(self, max_s: int = 5) -> None:
        """Times steps of 1..max_s tokens at every batch size once the one-off allocations are
        paid (each shape twice), so the cost model prices a batched verify from this device's
        own numbers from the first round. Leaves every slot empty."""
        for n in range(1, self.slots + 1):
            for s in range(1, max_s + 1):
                for _ in range(2):
                    self.reset()
                    self.step({b: [0] * s for b in range(n)})
        self.reset()

    def kv_bytes(self) -> int:
        return 0 if self.target is not None else self.facts.kv_bytes_per_token() * self.cache_rows * self.slots

    # -- batched steps -----------------------------------------------------------------------------
    def _padded(self, toks) -> np.ndarray:
        """A row's tokens as int64, with deterministic mode's copy rows appended (module docstring)."""
        t = np.asarray(toks, dtype=np.int64)
        if step_rows(t.shape[0], self.deterministic) > t.shape[0]:
            t = np.concatenate([t, t[-1:]])
        return t

    def step(self, rows: Mapping[int, Sequence[int]]) -> dict[int, np.ndarray]:
        """One pass over every slot: slot b in `rows` appends its tokens and gets the logits of all
        of them, [s_b, V] (a copy); slots not in `rows` are idle and unchanged. Raises CacheFull,
        writing nothing, if a row does not fit."""
        if not rows:
            raise ValueError("a batched step needs at least one row")
        for slot, toks in rows.items():
            if not 0 <= slot < self.slots:
                raise ValueError(f"slot {slot} is not in [0, {self.slots})")
            if len(toks) == 0:
                raise ValueError(f"row for slot {slot} has no tokens")
            if self.lengths[slot] + len(toks) > self.max_len:
                raise CacheFull(f"{len(toks)} token(s) at position {self.lengths[slot]} of slot {slot} "
                                f"do not fit a cache of {self.max_len}")
        if len(rows) == 1:
            ((slot, toks),) = rows.items()
            return {slot: self.slot(slot).step(toks, len(toks)).copy()}  # the whole cache's binding for one slot
        if self.target is not None:  # the self-draft: a slot of the block not drafting sits at its target's length
            lo, hi = self.pass_range(rows)
            for b in range(lo, hi):
                if b not in rows:
                    self.lengths[b] = self.target.lengths[b]
        padded = {slot: self._padded(toks) for slot, toks in rows.items()}
        S = max(len(t) for t in padded.values())
        if not self.one_pass:
            return self._one_token_pass(rows) if S == 1 else self._row_passes(rows)
        # rows [lo, hi): slots outside the active block are left out of the pass (views)
        lo, hi = self.pass_range(rows)
        if any(self.lengths[b] + S > self.max_len for b in range(lo, hi)):
            # near the cache's end a row padded to the pass's S queries (an idle one too) would run past
            # it: the operator refuses a padded chunk that does not fit the buffer, and positions past
            # the model's table. Each row runs alone then, at its own length (it fits: checked above)
            return self._row_passes(rows)
        n = hi - lo
        ids = np.zeros((n, S), dtype=np.int64)
        real = [len(padded.get(lo + b, ())) for b in range(n)]  # copy rows included
        lengths = self.lengths[lo:hi]
        # width: every row's ones, plus one cell for the padding mark where a row is padded
        kept = [max(1, lengths[b] + real[b]) for b in range(n)]
        width = max(k + (1 if real[b] < S else 0) for b, k in enumerate(kept))
        mask = np.zeros((n, width), dtype=np.int64)
        for b in range(n):
            if real[b]:
                ids[b, : real[b]] = padded[lo + b]
            # an empty idle slot still reports one cached row (the operator needs seqlens_k >= 0);
            # with no real tokens it neither reads the result nor writes anything
            mask[b, : kept[b]] = 1
            if real[b] < S:
                mask[b, kept[b]] = -(S - real[b])
        return self._pass(rows, lo, hi, ids, mask)

    def _pass(self, rows: Mapping[int, Sequence[int]], lo: int, hi: int, ids: np.ndarray,
              mask: np.ndarray) -> dict[int, np.ndarray]:
        """One pass over slots [lo, hi): ids [n, S], mask [n, width]; each row of `rows` advances by
        its own tokens, the others (idle, or padded to S) keep their lengths."""
        f = self.facts
        n, S = ids.shape
        width = mask.shape[1]
        lengths = self.lengths[lo:hi]
        t0 = time.perf_counter()
        bd = self.binding(lo, hi)
        bd.bind_cpu_input(f.input_ids, ids)
        bd.bind_cpu_input(f.attention_mask, mask)
        if self.bind_positions:
            pos = np.asarray(lengths, dtype=np.int64).reshape(n, 1) + np.arange(S, dtype=np.int64)
            for b in rows:
                if self.shifted[b]:  # rows placed at positions of their own: the chain follows the last
                    L = self.lengths[b]
                    self.set_positions(b, L, S, None)
                    pos[b - lo] = self.positions[b, L : L + S]
            bd.bind_cpu_input(f.position_ids, pos)
        if self.bind_bias:
            bd.bind_cpu_input(f.attention_bias, np.zeros((1, 1, S, width), dtype=self.bias_dtype))
        if self.has_logits_to_keep:
            bd.bind_cpu_input(f.logits_to_keep, np.array([S], dtype=np.int64))
        arr, ov = out_buffer(self.ort, self.logits_bufs, (n, S), (n, S, self.vocab_size), self.logits_dtype)
        bd.bind_ortvalue_output(f.logits, ov)
        if self.has_hidden:  # contract v3: every row's final hidden state [n, S, hidden], as a slot's step
            harr, hov = out_buffer(self.ort, self.hidden_bufs, (n, S), (n, S, self.facts.hidden_size), np.float32)
            bd.bind_ortvalue_output(f.hidden_states, hov)
        self.session.run_with_iobinding(bd)
        for b, toks in rows.items():
            L = self.lengths[b]
            self.lengths[b] += len(toks)  # a copy row's position is past the length: never read
            # the slot's hidden rows as Slot.step stores them (rows, first position, tokens): a copy, the
            # buffer is the next pass's
            self.hidden_rows[b] = ((harr[b - lo, : len(toks)].copy(), L, [int(t) for t in toks])
                                   if self.has_hidden else None)
        self.times.table(n).add(max(len(t) for t in rows.values()), time.perf_counter() - t0)
        return {b: arr[b - lo, : len(toks)].copy() for b, toks in rows.items()}


    # -- graphs without the padded-queries edit (module docstring) -----------------------------------
    def _one_token_pass(self, rows: Mapping[int, Sequence[int]]) -> dict[int, np.ndarray]:
        """Every row one token: one pass over [lo, hi). An idle slot in the block gets a padding token
        at its own length (mask: its cached rows + that one), written there and not counted."""
        lo, hi = self.pass_range(rows)
        n = hi - lo
        ids = np.zeros((n, 1), dtype=np.int64)
        mask = np.zeros((n, max(self.lengths[lo:hi]) + 1), dtype=np.int64)
        for b in range(n):
            if lo + b in rows:
                ids[b, 0] = rows[lo + b][0]
            mask[b, : self.lengths[lo + b] + 1] = 1
        return self._pass(rows, lo, hi, ids, mask)

    def _row_passes(self, rows: Mapping[int, Sequence[int]]) -> dict[int, np.ndarray]:
        """A row of several tokens among others: each row alone on its slot's view (batch 1, a single
        sequence's shapes); timed together as one step of the block's width."""
        lo, hi = self.pass_range(rows)
        t0 = time.perf_counter()
        out = {slot: self.slot(slot).step(toks, len(toks)).copy() for slot, toks in rows.items()}
        self.times.table(hi - lo).add(max(len(t) for t in rows.values()), time.perf_counter() - t0)
        return out
