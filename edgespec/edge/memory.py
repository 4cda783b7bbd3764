"""Memory budget: decide, before anything is loaded, how long the KV cache may be and whether the
draft model fits, so a board with 4-16 GB shared memory gets a smaller cache or no draft model, or a
refusal with the numbers, instead of an out-of-memory kill halfway through loading.

The prediction is the resident memory of the whole process once a request has filled the cache:

    runtime          python + numpy + onnxruntime, and the loaded tokenizer
    <role>_weights   the model's files x WEIGHT_FACTOR (repacked int4 weights + the mmapped embedding)
    <role>_kv        2 x layers x kv_heads x head_dim x max_len x dtype bytes (past and present share it)
    working          activations of the largest step (a prefill chunk) and the logits rows kept
    suffix_index     the suffix index full (it fills as requests accumulate)
    grammar          the grammar library's view of the vocabulary (the first structured request builds it)
    embedder         a sentence-embedding model beside the LLM (serve --embedder, or the one an index names)
    doc_index        a document index held in memory (--docs): its passages, token arrays and vectors
    margin           UNACCOUNTED: what the measured runs held beyond the terms above (allocator
                     arenas, onnxruntime's per-run buffers), so the plan is never under measured RSS

A cuda-flavored graph on a GPU provider (docs/edge.md, "Memory on a Jetson") also has a device
side, `predict_device`: its weights, float16 KV cache and activations live in CUDA memory, which
RSS does not show, and its KV cache is then not host memory. On a board whose GPU shares the DRAM
(every Jetson: `memory_shared_with_gpu`) the two add up against one budget, and the retreat below
is decided on the sum; on a discrete GPU they are kept apart (the budget is the host's).

Order of retreat when the budget is too small: shrink max_len (down to a floor), then drop the draft
model (n-gram drafting needs no memory), then refuse with BudgetError. The constants below were fitted
against measured RSS of real bundles (see docs/edge.md, "Memory budget"); edge/memcheck.py's
`compare` lets every load check the prediction again.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import BudgetError, InvalidRequest
from ..limits import PREFILL_CHUNK, SUFFIX_BYTES_PER_TOKEN, SUFFIX_CAPACITY
from ..models.bundle import Bundle
from ..units import format_size
from . import cache_length

# --- the model's constants, fitted to measured RSS (docs/edge.md, "Memory budget") ------------
RUNTIME_BASE = 90 << 20  # python + numpy + edgespec + onnxruntime and its first session's code and pools
TOKENIZER_FACTOR = 9  # a loaded `tokenizers.Tokenizer` holds ~9x its tokenizer.json (Qwen 8.2x, SmolLM2 9.8x)
# resident bytes per byte of model files: onnxruntime repacks quantized MatMulNBits weights (plus block
# sums) and the embedding table is served from the memory-mapped file, resident once tokens touch it
# "mixed" is a GGUF's own blocks carried over (the default target): its block-16 4-bit minimums and 8-bit
# Q6_K matmuls repack larger, measured 1.43x on Qwen2.5-Coder 1.5B (6 Dec); 1.45 keeps the plan over
WEIGHT_FACTOR = {"int4": 1.32, "int8": 1.32, "mixed": 1.45, "fp16": 1.05, "fp32": 1.05}
SESSION_OVERHEAD = 2 << 20  # per onnxruntime session: graph, kernels, arena bookkeeping
# Measured peak RSS minus the terms above (docs/edge.md, "The margin"): roughly constant, not
# proportional: glibc arenas and onnxruntime's per-run buffers. 59 MiB for SmolLM2 on the dev VM and
# 66 MiB in a CI run (6 Dec); 80 MiB covers both with 14 MiB to spare.
UNACCOUNTED = 80 << 20
# Device side of a cuda-flavored graph. Estimates from NVIDIA's documentation, NOT measured here
# (no GPU): `plan --measure` on a GPU measures the context first (gpumem.py, a fresh process) and
# plans with that number instead; scripts/gpu-check.sh records both.
CUDA_CONTEXT = 300 << 20  # CUDA context + onnxruntime's CUDA kernels resident on the device
CUBLAS_WORKSPACE = 32 << 20  # per session (cuBLAS default workspace, plus cuBLASLt's)
CUDA_ARENA_SLACK = 0.10  # the arena (kSameAsRequested) holds ~10 % more than the peak it was asked for
# A float16 KV cache run by the CPU provider (a cuda-flavored graph on the CPU: how cuda graphs are
# tested, and a Jetson without onnxruntime-gpu) held 2.15-2.25x its float16 bytes, measured (SmolLM2
# int8 cuda flavor, peak RSS at max_len 512/2048/4096: 0.047-0.049 MiB per token against 0.022 of
# float16 KV; without this the plan was up to 15-19 % under at 4096). 2.5 keeps the plan over.
CPU_FP16_KV_FACTOR = 2.5
# llguidance's view of the vocabulary (core/constraint.py: a trie of every token), built on the first
# request with a schema, grammar or tools and kept while the engine runs, plus the library's code
# loaded then. Measured (RSS before and after, llguidance 1.x, 4 Dec): 88.9 MiB for Qwen2.5's 151,936
# rows, 41.6 MiB for SmolLM2's 49,152, i.e. ~19 MiB + ~460 bytes a row; rounded up below
GRAMMAR_BASE = 20 << 20
GRAMMAR_BYTES_PER_TOKEN = 480
# A sentence-embedding model (docs/onnx_embedder.py), measured on all-MiniLM-L6-v2 int8 (26 MB of files,
# 6 Dec, onnxruntime 1.32, CPU): +47-51 MB RSS once loaded, +132 MB more after embedding 32 texts of 256 tokens
# in runs of BATCH_TOKENS (2048) padded tokens: the arena keeps its largest run's activations. multilingual-e5-small
# int8 (135 MB of files, 7 Dec): +458 MB once loaded (its tokenizer's 250,002 SentencePiece pieces alone 288 MB in
# the tokenizers library), +122 MB more after the same texts: 3.4x its files loaded, hence 3.5 (MiniLM: 227 MB planned)
EMBEDDER_FILE_FACTOR = 3.5
EMBEDDER_WORKING = 140 << 20
# A document index is read whole into memory (passages' text, token arrays, vectors): its files' bytes,
# x INDEX_FACTOR for Python's objects around the passages (an estimate: not yet measured on a real index)
INDEX_FACTOR = 2.0
MIN_MAX_LEN = 256  # below this a chat turn does not fit; the plan refuses instead of shrinking further
LEN_ALIGN = 64  # shrunk lengths are multiples of this (the floor itself is kept as given)


@dataclass
class MemoryPlan:
    """What to load and how big the caches may be. `breakdown` (host memory) sums to `predicted_bytes`,
    plus `device_breakdown` where the device shares the host's DRAM (`unified`); on a discrete GPU
    the device side is reported beside it and not counted against the (host) budget."""

    max_len: int
    load_draft: bool
    predicted_bytes: int
    breakdown: dict[str, int]
    notes: list[str] = field(default_factory=list)
    budget_bytes: int | None = None
    prefill_chunk: int = PREFILL_CHUNK
    requested_max_len: int | None = None
    device_breakdown: dict[str, int] = field(default_factory=dict)  # empty: the graphs run on the CPU
    unified: bool = False

    @property
    def device_bytes(self) -> int:
        return sum(self.device_breakdown.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "max_len": self.max_len,
            "load_draft": self.load_draft,
            "predicted_bytes": self.predicted_bytes,
            "budget_bytes": self.budget_bytes,
            "prefill_chunk": self.prefill_chunk,
            "requested_max_len": self.requested_max_len,
            "breakdown": dict(self.breakdown),
            "device_breakdown": dict(self.device_breakdown),
            "device_bytes": self.device_bytes,
            "unified": self.unified,
            "notes": list(self.notes),
        }

    def describe(self) -> str:
        """Several lines for `edgespec plan` and logs: the numbers, then what was given up and why."""
        lines = [f"max_len {self.max_len}, draft model {'loaded' if self.load_draft else 'not loaded'}"]
        dev = {f"device {k}": v for k, v in self.device_breakdown.items()} if self.unified else {}
        parts = {**self.breakdown, **dev}
        width = max(len(k) for k in parts) if parts else 0
        for k, v in parts.items():
            if v:
                lines.append(f"  {k:<{width}}  {format_size(v):>10}")
        total = f"  {'total':<{width}}  {format_size(self.predicted_bytes):>10}"
        if self.budget_bytes:
            total += f"  of budget {format_size(self.budget_bytes)} ({100 * self.predicted_bytes / self.budget_bytes:.0f} %)"
        lines.append(total)
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def _default_budget_note(profile, budget_bytes: int) -> str:
    """Where the default budget came from: the profile's own size, or (a profile without one, such as
    a Pi 4, planned from another machine) the memory of the machine this runs on, which is no default
    of that board."""
    det = getattr(profile, "detected", {}) or {}
    on = det.get("memory_measured_on")
    if det.get("memory_source") == "measured" and on not in (None, "this board"):
        return (f"memory budget {format_size(budget_bytes)} follows from the {format_size(profile.memory_bytes)} "
                f"measured on {on}, not from a {profile.id} (its profile has no memory size): give --memory-budget "
                f"for the board you plan for")
    return f"memory budget {format_size(budget_bytes)} is the {profile.id} default"


# --- prediction ----------------------------------------------------------------------------------
def _open(bundle):
    if isinstance(bundle, Bundle):
        return bundle
    return Bundle.open(bundle, verify=False)


def _intermediate_size(facts) -> int:
    """The MLP width is not in the manifest; recover it from the parameter count
    (params = embeddings + final norm + layers x (attention + biases + 2 norms + 3 x hidden x
    intermediate)), else assume 4 x hidden.

    The count may hold the embedding once (tied lm_head) or twice (untied; a GGUF often stores
    output.weight even for a tied model), and the manifest does not say which: both readings are
    tried and the one nearer a multiple of 64 wins (MLP widths are: Qwen2.5 8960 and 4864, SmolLM2
    1536; with the small terms counted the right reading comes out exact). Bundles written before
    the export filled `params` have 0 there: 4 x hidden then."""
    h, layers = facts.hidden_size, facts.layers
    kv = facts.kv_heads * facts.head_dim
    if not facts.params or layers <= 0 or h <= 0:
        return 4 * h
    emb = facts.vocab_size * h
    attn = h * h * 2 + 2 * h * kv  # q and o [h, h]; k and v [h, kv]
    small = 2 * h + (h + 2 * kv if facts.arch == "qwen2" else 0)  # two norms; Qwen2's q/k/v biases
    candidates = []
    for embeddings in (emb, 2 * emb):  # tied or untied lm_head
        per_layer = (facts.params - embeddings - h) / layers - attn - small
        inter = per_layer / (3 * h)
        if h / 2 <= inter <= 8 * h:
            candidates.append(inter)
    if not candidates:
        return 4 * h
    return int(round(min(candidates, key=lambda x: abs(x - 64 * round(x / 64)))))


def working_bytes(facts, max_len: int, prefill_chunk: int, *, verify_rows: int = 16) -> int:
    """Peak activations of one session: the largest step is a prefill chunk of S tokens.

    Shapes (fp32): hidden states [S, H] ~4 alive at once, MLP [S, I] x 2, logits [rows, V] for the
    rows kept (onnxruntime's arena reuses buffers across layers, so this is one layer's worth;
    measured on Qwen2.5 1.5B/0.5B and SmolLM2 at max_len 2048, chunk 512, within ~10 MiB)."""
    s = max(1, min(prefill_chunk, max_len))
    h = facts.hidden_size
    inter = _intermediate_size(facts)
    act = s * (4 * h + 2 * inter) * 4
    logits = max(verify_rows, 1) * facts.vocab_size * 4
    return SESSION_OVERHEAD + act + logits


def graph_facts(b, role: str, flavor: str | None = None):
    """The facts of the graph of `role` the runtime would load for `flavor` (None: the primary)."""
    facts = b.manifest.models[role]
    return facts.graphs().get(flavor, facts) if flavor else facts


def graph_file_bytes(b, facts) -> int:
    """Bytes of one graph's files (model.onnx + its .data): not the role's folder, which may hold
    the other flavor too."""
    files = b.manifest.files
    return sum(files.get(rel, {}).get("size", 0) for rel in (facts.path, facts.path + ".data"))


def weights_bytes(b, role: str, flavor: str | None = None) -> int:
    facts = graph_facts(b, role, flavor)
    size = graph_file_bytes(b, facts) if facts.flavors or flavor else b.model_bytes(role)
    return int(WEIGHT_FACTOR.get(facts.quant, 1.32) * size)


def runtime_bytes(b) -> int:
    tok = b.root / "tokenizer.json"
    size = tok.stat().st_size if tok.exists() else 0
    return RUNTIME_BASE + TOKENIZER_FACTOR * size


def embedder_bytes(files_bytes: int) -> int:
    """Resident bytes of an embedding model whose folder holds `files_bytes` (OnnxEmbedder.nbytes)."""
    return int(EMBEDDER_FILE_FACTOR * files_bytes) + EMBEDDER_WORKING if files_bytes else 0


def doc_lines(embedder_files: int = 0, index_files: int = 0) -> dict[str, int]:
    """The breakdown lines of a venue's documents, from the bytes of the embedder's and the index's files
    (docs/embedder_folder.py files_bytes): for `plan` and the engine's memory plan."""
    parts = {}
    if embedder_files:
        parts["embedder"] = embedder_bytes(embedder_files)
    if index_files:
        parts["doc_index"] = int(INDEX_FACTOR * index_files)
    return parts


def predict(bundle, max_len: int, load_draft: bool, *, prefill_chunk: int = PREFILL_CHUNK,
            flavor: str | None = None, device: str = "cpu", suffix_tokens: int = SUFFIX_CAPACITY,
            doc_lines: dict[str, int] | None = None) -> dict[str, int]:
    """The host breakdown (bytes) for one choice of max_len and draft; `plan` searches over these.
    `flavor`: the graphs the runtime will load (None: each model's primary graph). `device` "cuda":
    the KV caches are device memory (predict_device), not host memory. The weights stay counted
    here too until a measurement on a board says how much of the host copy onnxruntime releases.
    `suffix_tokens`: the suffix index's capacity, counted full (it fills as requests accumulate).
    `doc_lines`: doc_lines()' lines (an embedding model, a document index), counted as they are."""
    b = _open(bundle)
    t = graph_facts(b, "target", flavor)
    parts = {
        "runtime": runtime_bytes(b),
        "target_weights": weights_bytes(b, "target", flavor),
        "target_kv": _host_kv(t, max_len, device),
        "working": working_bytes(t, max_len, prefill_chunk),
        "draft_weights": 0,
        "draft_kv": 0,
        "suffix_index": suffix_index_bytes(suffix_tokens),
        "grammar": grammar_bytes(t),
        **(doc_lines or {}),
        "margin": UNACCOUNTED,
    }
    if load_draft and b.draft is not None:
        d = graph_facts(b, "draft", flavor)
        parts["draft_weights"] = weights_bytes(b, "draft", flavor)
        parts["draft_kv"] = _host_kv(d, max_len, device)
        parts["working"] += working_bytes(d, max_len, prefill_chunk)
    if device == "cuda":
        parts["target_kv"] = parts["draft_kv"] = 0
    return parts


def _host_kv(facts, max_len: int, device: str) -> int:
    """Host bytes of one model's KV cache: its own size, x CPU_FP16_KV_FACTOR for a float16 cache on
    the CPU provider (a cuda-flavored graph there)."""
    kv = facts.kv_bytes_per_token() * max_len
    return int(CPU_FP16_KV_FACTOR * kv) if device == "cpu" and facts.graph_flavor() == "cuda" else kv


def predict_device(bundle, max_len: int, load_draft: bool, *, prefill_chunk: int = PREFILL_CHUNK,
                   trt_workspace: int = 0, context_bytes: int | None = None) -> dict[str, int]:
    """Device memory (bytes) of the cuda-flavored graphs on the CUDA provider: the weights copied to
    the device (their file size: MatMulNBits keeps the packed bytes), the float16 KV cache, the
    activations (float16: half of `working_bytes`'s float32 figure) with the arena's slack, and the
    fixed costs (CUDA_CONTEXT, CUBLAS_WORKSPACE per session, TensorRT's workspace when it is in the
    order). The fixed costs are estimates, not measurements (see the constants), except a
    `context_bytes` measured on this machine (gpumem.context_cost)."""
    b = _open(bundle)
    roles = ["target"] + (["draft"] if load_draft and b.draft is not None else [])
    parts = {"cuda_context": CUDA_CONTEXT if context_bytes is None else int(context_bytes), "cublas_workspace": CUBLAS_WORKSPACE * len(roles),
             "trt_workspace": int(trt_workspace)}
    for role in roles:
        f = graph_facts(b, role, "cuda")
        parts[f"{role}_weights"] = graph_file_bytes(b, f)
        parts[f"{role}_kv"] = f.kv_bytes_per_token() * max_len
        parts[f"{role}_activations"] = int((1 + CUDA_ARENA_SLACK) * working_bytes(f, max_len, prefill_chunk) / 2)
    return parts


def plan(
    bundle,
    *,
    max_len: int | None,
    want_draft: bool,
    budget_bytes: int | None,
    profile=None,
    min_len: int = MIN_MAX_LEN,
    prefill_chunk: int = PREFILL_CHUNK,
    flavor: str | None = None,
    device: str = "cpu",
    context_bytes: int | None = None,
    doc_lines: dict[str, int] | None = None,
) -> MemoryPlan:
    """Chooses max_len and whether to load the draft so the prediction fits `budget_bytes`.

    `max_len=None` takes cache_length.default_max_len (the bundle's export default, capped by the board's), capped
    at the model's context.
    `budget_bytes=None` takes the profile's default budget; with neither, nothing is shrunk.
    `device` "cuda" (the graphs run on the CUDA provider) adds the device side (predict_device, with
    a measured `context_bytes` if given); on a profile with `memory_shared_with_gpu` it counts
    against the budget with the host side, so shrinking, dropping the draft and refusing follow the sum.
    `doc_lines`: doc_lines()' lines, fixed costs beside the LLM (no retreat shrinks them).
    Raises BudgetError, with the numbers, when even the target alone at the floor length is too big.
    """
    b = _open(bundle)
    notes: list[str] = []
    context = b.target.max_context
    if b.draft is not None:
        context = min(context, b.draft.max_context)
    if max_len is None:
        want_len = cache_length.default_max_len(b, profile)
    else:
        cache_length.check_max_len(max_len)
        want_len = int(max_len)
    if want_len > context:
        notes.append(f"max_len {want_len} capped at the model's context length {context}")
        want_len = context
    floor = min(min_len, want_len)
    if budget_bytes is None and profile is not None:
        budget_bytes = getattr(profile, "memory_budget_bytes", None)
        if budget_bytes:
            notes.append(_default_budget_note(profile, budget_bytes))
    if budget_bytes is not None and budget_bytes <= 0:
        raise InvalidRequest(f"memory budget must be positive, got {budget_bytes}", param="memory_budget")
    load_draft = bool(want_draft and b.draft is not None)
    if want_draft and b.draft is None:
        notes.append("bundle has no draft model: drafting can use n-gram lookup only")

    unified = bool(device == "cuda" and getattr(profile, "memory_shared_with_gpu", False))

    def make(length: int, draft: bool) -> MemoryPlan:
        parts = predict(b, length, draft, prefill_chunk=prefill_chunk, flavor=flavor, device=device,
                        doc_lines=doc_lines)
        dev = predict_device(b, length, draft, prefill_chunk=prefill_chunk,
                             context_bytes=context_bytes) if device == "cuda" else {}
        return MemoryPlan(
            max_len=length, load_draft=draft, predicted_bytes=sum(parts.values()) + unified * sum(dev.values()),
            breakdown=parts, notes=notes, budget_bytes=budget_bytes, prefill_chunk=prefill_chunk,
            requested_max_len=want_len, device_breakdown=dev, unified=unified,
        )

    def fits(draft: bool):
        return lambda n: make(n, draft).predicted_bytes <= budget_bytes

    def sum_words(p: MemoryPlan) -> str:
        """Where a unified plan's number comes from (the host side alone is not the whole story)."""
        return (f" (host {format_size(p.predicted_bytes - p.device_bytes)} + device {format_size(p.device_bytes)}: "
                f"one DRAM on this board)") if unified else ""

    full = make(want_len, load_draft)
    if budget_bytes is None or full.predicted_bytes <= budget_bytes:
        return full
    over = full.predicted_bytes - budget_bytes
    # 1. shrink the cache, keeping the draft
    if load_draft:
        length = _longest_fitting(fits(True), floor, want_len)
        if length is not None:
            notes.append(
                f"max_len shrunk from {want_len} to {length}: the full length needs "
                f"{format_size(full.predicted_bytes)}{sum_words(full)}, {format_size(over)} over the budget"
            )
            return make(length, True)
    # 2. drop the draft model (n-gram drafting costs no memory), as long a cache as then fits
    length = _longest_fitting(fits(False), floor, want_len)
    if length is not None:
        if load_draft:
            at_floor = make(floor, True)
            notes.append(
                f"draft model dropped: with it even max_len {floor} needs {format_size(at_floor.predicted_bytes)}"
                f"{sum_words(at_floor)} "
                f"(budget {format_size(budget_bytes)}); n-gram drafting still works"
            )
        if length < want_len:
            notes.append(f"max_len shrunk from {want_len} to {length} to fit the budget"
                         + (f": the full length needs {format_size(full.predicted_bytes)}{sum_words(full)}" if unified else ""))
        return make(length, False)
    # 3. refuse, with the numbers
    smallest = make(floor, False)
    parts = {**smallest.breakdown, **({f"device_{k}": v for k, v in smallest.device_breakdown.items()} if unified else {})}
    detail = " + ".join(f"{k.replace('_', ' ')} {format_size(v)}" for k, v in parts.items() if v)
    detail += " (host and device: one DRAM on this board)" if unified else ""
    err = BudgetError(
        f"memory budget {format_size(budget_bytes)} is too small for bundle {b.name}: the smallest plan "
        f"(target model only, max_len {floor}) needs {format_size(smallest.predicted_bytes)} = {detail}; "
        f"the full plan (max_len {want_len}{', with draft' if load_draft else ''}) needs "
        f"{format_size(full.predicted_bytes)}. Raise --memory-budget to at least "
        f"{format_size(smallest.predicted_bytes)} or use a smaller model"
    )
    err.needed_bytes = smallest.predicted_bytes  # type: ignore[attr-defined]
    err.budget_bytes = budget_bytes  # type: ignore[attr-defined]
    err.breakdown = parts  # type: ignore[attr-defined]
    raise err


MAX_AUTO_SLOTS = 4  # --parallel auto stops here: past it each row's share of a pass grows, not the aggregate


def slot_bytes(facts, max_len: int, *, verify_rows: int = 9) -> int:
    """What one more concurrent request costs (server --parallel): its cache slot, its rows of a
    batched verify's logits, and the suffix index of its own text (at most max_len tokens; it drafts
    from the shared history of finished requests without a copy, engine/batch_drafters.py)."""
    return (facts.kv_bytes_per_token() * (max_len + 1) + verify_rows * facts.vocab_size * 4
            + suffix_index_bytes(max_len + 1))


def grammar_bytes(facts) -> int:
    """Host bytes of the grammar library's view of the vocabulary (structured output), once built."""
    return GRAMMAR_BASE + GRAMMAR_BYTES_PER_TOKEN * facts.vocab_size


LAZY_PARTS = ("suffix_index", "grammar")  # empty in an engine that has just opened: they grow with requests


def suffix_index_bytes(tokens: int = SUFFIX_CAPACITY) -> int:
    """Host bytes of a full suffix index of `tokens` tokens (limits.SUFFIX_BYTES_PER_TOKEN)."""
    return (tokens + 1) * SUFFIX_BYTES_PER_TOKEN


def slots_that_fit(bundle, plan_: "MemoryPlan", budget_bytes: int, *, cap: int = MAX_AUTO_SLOTS) -> int:
    """How many cache slots fit `budget_bytes` next to the weights: the plan (weights, one slot,
    working memory) plus `slot_bytes` per extra slot, and the draft model's cache slot per extra slot
    when the plan loads it (the engine gives the draft a slot per request slot, engine/draft_batch.py);
    at least 1 (the plan itself was checked)."""
    b = _open(bundle)
    extra = budget_bytes - plan_.predicted_bytes
    per = slot_bytes(b.target, plan_.max_len)
    if plan_.load_draft and b.draft is not None:
        per += b.draft.kv_bytes_per_token() * (plan_.max_len + 1)
    return max(1, min(cap, 1 + max(0, extra) // per))


def _longest_fitting(fits, floor: int, want: int) -> int | None:
    """Largest max_len in [floor, want] for which `fits(max_len)` (the prediction grows with max_len),
    aligned down to LEN_ALIGN unless that would cross the floor."""
    if not fits(floor):
        return None
    lo, hi = floor, want  # fits(lo) is true
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    aligned = (lo // LEN_ALIGN) * LEN_ALIGN
    return aligned if aligned >= floor and lo != want else lo
