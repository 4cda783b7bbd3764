"""One model, one session, a KV cache with a slot per concurrent request, written in place.

The cache buffers are [N, kv_heads, MAX, head_dim] (N slots, fixed at load). Each slot has its own
length L_b, rewound independently. A batched step feeds every slot the same number S of input
tokens: slot b's real tokens (s_b of them, 0 for an idle slot) right-padded to S. The graph learns
which tokens are real from the attention mask (export/graph_batch.py, "padded queries"):

    mask[b] = 1 x (L_b + s_b), then one cell holding -(S - s_b) when the row is padded, then zeros

so GroupQueryAttention reads L_b cached rows, writes s_b new ones at [L_b, L_b + s_b) and leaves the
slot's other rows alone; an idle slot (s_b = 0) is unchanged.

Without that edit (the cuda flavor, whose onnxruntime-gpu releases have no query_seqlens; a cpu graph
loaded by an onnxruntime older than 1.32.0, models/ortcompat.py) GroupQueryAttention refuses a pass of
several rows of several tokens over a cache (kernels.BATCH_SOURCE). Such a graph still serves several
requests: a step where every row has one token is one pass, each row padded to that one token (an
idle slot's padding is written at its own length and the slot is rewound to it: those positions are
never read); a step with a longer row runs each row alone on its slot's view. The same kernels and
shapes as a single request's: batched output equals batch-1 output.

A step of one slot alone (a new request's prompt) runs on a [1, kv, MAX, hd] view of that slot's
block of the buffers, so a prefill does not pay for the other N-1 rows: the buffers are slot-major,
so slots [lo, hi) are one contiguous block, bound by address (CPU and GPU alike).

Deterministic mode (`deterministic=True`, as core/runner.py's): a row whose last real token would
be computed alone (core/runner.py's step_rows: 1 token, or 17, 33, ...) gets a copy of it as one more
real token, written past the slot's length, its logits dropped; rows do not depend on the other
rows of the pass nor on their padding (measured, docs/runtime.md). The cache gets one more spare
position for the copy.

Shapes: `step(rows)` rows {slot: tokens [s_b]} -> {slot: logits [s_b, V]} (copies);
`step_one(slot, tokens, n_logits)` -> logits [n_logits, V] (a view of a reused buffer).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from ..models.manifest import ModelFacts
from ..models.ortcompat import PADDED_QUERIES_KEY
from .dtypes import NP_DTYPES
from .runner import CacheFull, StepTimes, contract_inputs, step_rows

log = logging.getLogger("edgespec.core.batch_runner")


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


def graph_batches(session) -> bool:
    """Whether the graph marks padded queries (export/graph_batch.py): needed for N > 1 slots."""
    try:
        meta = session.get_modelmeta().custom_metadata_map
    except Exception:  # noqa: BLE001 - a provider without metadata: treat as old graph
        return False
    return meta.get(PADDED_QUERIES_KEY) == "1"


@dataclass
class BatchTimes:
    """Step wall times by rows in the step (the batch size), each a StepTimes by tokens per row.
    The cost model of a request in a batch of B reads `by_rows[B]`: a verify of k+1 tokens there
    costs what a step of B rows x (k+1) tokens costs, which is what batching makes it cost."""

    by_rows: dict[int, StepTimes] = field(default_factory=dict)

    def table(self, rows: int) -> StepTimes:
        t = self.by_rows.get(rows)
        if t is None:
            t = self.by_rows[rows] = StepTimes()
        return t

    def pricing(self, rows: int) -> StepTimes:
        """The table a pass of `rows` rows is priced from: its own, or one row's until it has run."""
        t = self.table(rows)
        return t if t.count else self.table(1)


class BatchRunner:
    def __init__(self, session, facts: ModelFacts, max_len: int, slots: int, *, device: str = "cpu",
                 device_id: int = 0, deterministic: bool = False):
        import onnxruntime as ort

        if max_len < 2:
            raise ValueError(f"max_len must be at least 2, got {max_len}")
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise ValueError(f"slots must be an integer >= 1, got {slots!r}")
        # whether a step of several multi-token rows is one pass (the padded-queries edit), or a pass per row
        self.one_pass = slots == 1 or graph_batches(session)
        if not self.one_pass:
            log.info("batched verify runs a pass per row: %s", _why_per_row(facts, ort.__version__))
        self._ort = ort
        self.device_id = int(device_id)
        self.session = session
        self.facts = facts
        self.max_len = int(max_len)
        self.slots = slots
        self.vocab_size = facts.vocab_size
        self.lengths = [0] * slots  # tokens each slot's cache holds
        self.times = BatchTimes()
        self.device = device
        self.deterministic = bool(deterministic)
        self._has_logits_to_keep = facts.logits_to_keep is not None and facts.logits_to_keep in {
            i.name for i in session.get_inputs()
        }
        kv_dtype = NP_DTYPES[facts.kv_dtype]
        names = {i.name for i in session.get_inputs()}
        # graph contract v2 (tree verification) adds per-token positions and an attention bias; a
        # batched step feeds each row's positions (L_b + j) and a zero bias
        self._positions_in, self._bias_in = contract_inputs(facts, names)  # runner.py: v3 cuda has no bias
        self._bias_dtype = kv_dtype
        # one spare position: a full row padded in a batched step needs a mask one wider than the
        # cache (its padding mark's cell), and the operator wants the mask to fit the buffer; one
        # more in deterministic mode for a last token's copy
        self._rows = self.max_len + 1 + (1 if deterministic else 0)
        shape = (slots, facts.kv_heads, self._rows, facts.head_dim)
        self._arrays: list[np.ndarray] = []  # CPU only: the numpy buffers the OrtValues share (kept alive)
        self._kv: list = []  # in binding order: key_0, value_0, key_1, ...
        for _ in range(facts.layers * 2):
            if device == "cpu":
                arr = np.zeros(shape, dtype=kv_dtype)
                self._arrays.append(arr)
                self._kv.append(ort.OrtValue.ortvalue_from_numpy(arr))
            else:
                self._kv.append(ort.OrtValue.ortvalue_from_shape_and_type(list(shape), kv_dtype, device, device_id))
        self._logits_dtype = NP_DTYPES[facts.logits_dtype]
        self._logits: dict[tuple[int, int], tuple[np.ndarray, object]] = {}
        self._binding = self._bind(self._kv)
        self._range_bindings: dict[tuple[int, int], object] = {}

    def _bind(self, kv: list):
        b = self.session.io_binding()
        f = self.facts
        for i in range(f.layers):
            k, v = kv[2 * i], kv[2 * i + 1]
            b.bind_ortvalue_input(f.past_key % i, k)
            b.bind_ortvalue_input(f.past_value % i, v)
            b.bind_ortvalue_output(f.present_key % i, k)
            b.bind_ortvalue_output(f.present_value % i, v)
        return b

    def _view_binding(self, lo: int, hi: int):
        """A binding over slots [lo, hi) only: their block of the buffers is contiguous (C order,
        slot first), bound by its address, so a step pays for hi - lo rows and writes in place."""
        f = self.facts
        b = self.session.io_binding()
        shape = [hi - lo, f.kv_heads, self._rows, f.head_dim]
        dtype = NP_DTYPES[f.kv_dtype]
        per_slot = f.kv_heads * self._rows * f.head_dim * np.dtype(dtype).itemsize
        names = [(f.past_key, f.present_key), (f.past_value, f.present_value)]
        for i in range(f.layers):
            for j, (past, present) in enumerate(names):
                addr = self._kv[2 * i + j].data_ptr() + lo * per_slot
                b.bind_input(past % i, self.device, self.device_id, dtype, shape, addr)
                b.bind_output(present % i, self.device, self.device_id, dtype, shape, addr)
        return b

    def _range_binding(self, lo: int, hi: int):
        """Binding of slots [lo, hi): a batch runs from its lowest active slot to its highest."""
        if (lo, hi) == (0, self.slots):
            return self._binding
        b = self._range_bindings.get((lo, hi))
        if b is None:
            b = self._range_bindings[(lo, hi)] = self._view_binding(lo, hi)
        return b

    def pass_range(self, slots) -> tuple[int, int]:
        """The slots [lo, hi) a pass over these active slots runs: the block from the lowest to the
        highest (the idle ones between them included)."""
        return min(slots), max(slots) + 1

    def _logits_out(self, rows: int, n: int):
        buf = self._logits.get((rows, n))
        if buf is None:
            arr = np.empty((rows, n, self.vocab_size), dtype=self._logits_dtype)
            buf = (arr, self._ort.OrtValue.ortvalue_from_numpy(arr))
            self._logits[(rows, n)] = buf
        return buf

    # -- state --------------------------------------------------------------------------------
    def free(self, slot: int) -> int:
        return self.max_len - self.lengths[slot]

    def rewind(self, slot: int, length: int) -> None:
        """Keeps the slot's first `length` positions (O(1): stale rows are never read)."""
        if not 0 <= length <= self.lengths[slot]:
            raise ValueError(f"cannot rewind slot {slot} holding {self.lengths[slot]} tokens to {length}")
        self.lengths[slot] = length

    def reset(self, slot: int | None = None) -> None:
        for s in range(self.slots) if slot is None else (slot,):
            self.lengths[s] = 0

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
        return self.facts.kv_bytes_per_token() * self._rows * self.slots

    # -- steps ----------------------------------------------------------------------------------
    def step_one(self, slot: int, tokens: Sequence[int], n_logits: int = 1) -> np.ndarray:
        """One slot alone (a prefill chunk): logits of its last n_logits tokens, [n_logits, V]."""
        s = len(tokens)
        if not 0 <= slot < self.slots:
            raise ValueError(f"slot {slot} is not in [0, {self.slots})")
        if s == 0:
            raise ValueError("step needs at least one token")
        if not 1 <= n_logits <= s:
            raise ValueError(f"n_logits must be in [1, {s}], got {n_logits}")
        if self.lengths[slot] + s > self.max_len:
            raise CacheFull(f"{s} token(s) at position {self.lengths[slot]} do not fit a cache of {self.max_len}")
        return self._run(self._range_binding(slot, slot + 1), 1, [np.asarray(tokens)], [slot], n_logits)[0]

    def _padded(self, toks) -> np.ndarray:
        """A row's tokens as int64, with deterministic mode's copy rows appended (module docstring)."""
        t = np.asarray(toks, dtype=np.int64)
        if step_rows(t.shape[0], self.deterministic) > t.shape[0]:
            t = np.concatenate([t, t[-1:]])
        return t

    def _run(self, binding, rows: int, toks: list[np.ndarray], slots: list[int], n_logits: int) -> list[np.ndarray]:
        """A single-row step on `binding` (one slot's view, or the whole cache when N == 1)."""
        f = self.facts
        (t,) = toks
        s = t.shape[0]
        t = self._padded(t)
        n = t.shape[0]  # s, or more with deterministic mode's copy rows (dropped below)
        length = self.lengths[slots[0]]
        t0 = time.perf_counter()
        binding.bind_cpu_input(f.input_ids, t.reshape(1, n))
        binding.bind_cpu_input(f.attention_mask, np.ones((1, length + n), dtype=np.int64))
        if self._positions_in:
            binding.bind_cpu_input(f.position_ids, np.arange(length, length + n, dtype=np.int64).reshape(1, n))
        if self._bias_in:
            binding.bind_cpu_input(f.attention_bias, np.zeros((1, 1, n, length + n), dtype=self._bias_dtype))
        keep = n_logits + n - s if self._has_logits_to_keep else n
        if self._has_logits_to_keep:
            binding.bind_cpu_input(f.logits_to_keep, np.array([keep], dtype=np.int64))
        arr, ov = self._logits_out(1, keep)
        binding.bind_ortvalue_output(f.logits, ov)
        self.session.run_with_iobinding(binding)
        self.lengths[slots[0]] += s
        self.times.table(1).add(s, time.perf_counter() - t0)
        return [arr[0][keep - (n - s) - n_logits : keep - (n - s)]]

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
        padded = {slot: self._padded(toks) for slot, toks in rows.items()}
        S = max(len(t) for t in padded.values())
        if len(rows) == 1:
            ((slot, toks),) = rows.items()
            binding = self._range_binding(slot, slot + 1)  # the whole cache when there is one slot
            return {slot: self._run(binding, 1, [np.asarray(toks)], [slot], len(toks))[0].copy()}
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
        bd = self._range_binding(lo, hi)
        bd.bind_cpu_input(f.input_ids, ids)
        bd.bind_cpu_input(f.attention_mask, mask)
        if self._positions_in:
            pos = np.asarray(lengths, dtype=np.int64).reshape(n, 1) + np.arange(S, dtype=np.int64)
            bd.bind_cpu_input(f.position_ids, pos)
        if self._bias_in:
            bd.bind_cpu_input(f.attention_bias, np.zeros((1, 1, S, width), dtype=self._bias_dtype))
        if self._has_logits_to_keep:
            bd.bind_cpu_input(f.logits_to_keep, np.array([S], dtype=np.int64))
        arr, ov = self._logits_out(n, S)
        bd.bind_ortvalue_output(f.logits, ov)
        self.session.run_with_iobinding(bd)
        for b, toks in rows.items():
            self.lengths[b] += len(toks)  # a copy row's position is past the length: never read
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
        """A row of several tokens among others: each row alone on its slot's view (batch 1, the
        serial runner's shapes); timed together as one step of the block's width."""
        lo, hi = self.pass_range(rows)
        t0 = time.perf_counter()
        out = {slot: self._run(self._range_binding(slot, slot + 1), 1, [np.asarray(toks)], [slot], len(toks))[0].copy()
               for slot, toks in rows.items()}
        self.times.table(hi - lo).add(max(len(t) for t in rows.values()), time.perf_counter() - t0)
        return out


class BatchSlot:
    """One slot of a BatchRunner behind ModelRunner's interface: lets an Engine (tokenizer,
    validation, the serial loop) sit on the batched cache. Use it only while no batch runs."""

    def __init__(self, runner: BatchRunner, slot: int = 0):
        self.runner, self.slot = runner, slot
        self.max_len = runner.max_len
        self.deterministic = runner.deterministic
        self.vocab_size = runner.vocab_size
        self.times: StepTimes = runner.times.table(1)

    @property
    def length(self) -> int:
        return self.runner.lengths[self.slot]

    @property
    def free(self) -> int:
        return self.runner.free(self.slot)

    def step(self, tokens, n_logits: int = 1) -> np.ndarray:
        return self.runner.step_one(self.slot, tokens, n_logits)

    def rewind(self, length: int) -> None:
        self.runner.rewind(self.slot, length)

    def reset(self) -> None:
        self.runner.reset(self.slot)
