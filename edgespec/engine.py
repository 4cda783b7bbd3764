"""Engine: a bundle opened for generation — text in, text out, as the target alone would write it.

    eng = Engine.open("bundles/qwen-coder")                    # draft="auto" | "model" | "ngram" | "none"
    r = eng.generate("def fib(n):", max_new_tokens=64)
    for delta in eng.stream(messages=[{"role": "user", "content": "hi"}], temperature=0.7, seed=1): ...

What it adds on top of the speculative loop (speculative.py):
- tokenizing, the bundle's chat template, and streaming text that never splits a character;
- stop conditions: EOS ids, stop strings (also when split across tokens), max_new_tokens, a full
  cache, and `cancel` (checked before every target pass);
- prefix reuse: the caches keep what the last request left in them, and a new request rewinds to the
  longest common prefix and prefills only the rest (a chat's next turn, a server's shared system
  prompt). Rewinding is exact, so reuse never changes the output;
- the edge hooks: a memory plan (memory.py) sizes the cache and decides whether the draft fits;
  a governor (governor.py) caps k or drafting, or paces rounds, under a power or thermal limit;
- per-request statistics.

One request runs at a time per engine (a lock); the server queues in front of it.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from .bundle import Bundle
from .costmodel import CostModel
from .detokenize import TextStream
from .drafters import (
    DRAFT_MODES,
    PREFILL_CHUNK,
    AutoDrafter,
    Drafter,
    ModelDrafter,
    NgramDrafter,
    NoDrafter,
    common_prefix,
)
from .errors import DraftUnavailable, InvalidRequest, PromptTooLong
from .runner import ModelRunner, load_runner
from .sampling import SamplingParams, choose, make_rng
from .speculative import speculative_round

log = logging.getLogger("edgespec.engine")

DEFAULT_MAX_LEN = 2048
K_LIMIT = 16  # largest k a request may ask for (each verify row costs a full-vocabulary logits row)
DEFAULT_K_CAP = 8  # adaptive k never proposes more than this per round


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    new_tokens: int = 0
    target_passes: int = 0  # target steps, the prefill counted once
    drafted: int = 0  # proposals the target checked
    accepted: int = 0
    acceptance_rate: float = 0.0  # accepted / drafted
    tokens_per_pass: float = 0.0  # new tokens / target passes (1.0 for the target alone)
    ttft_s: float = 0.0  # request start -> first token chosen (tokenizing and prefill included)
    decode_tokens_per_second: float = 0.0  # tokens after the first / time after the first
    total_s: float = 0.0
    drafter: str = "none"  # the mode the request ran with
    k_mean: float = 0.0  # proposals per decode round
    energy_j_per_token: float | None = None  # None without a power sensor
    cached_tokens: int = 0  # prompt tokens reused from the previous request's cache
    rounds: int = 0  # decode rounds (target passes after the prefill)
    rounds_by_source: dict[str, int] = field(default_factory=dict)  # "model" | "ngram" | "none" -> rounds

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


@dataclass
class _Request:
    ids: list[int]
    max_new_tokens: int
    params: SamplingParams
    stop: list[str]
    draft: str
    k: int | None
    cancel: Callable[[], bool]


class Stream:
    """Iterate for text deltas; `result` holds the GenerationResult once iteration has ended.
    Breaking out early (or `close()`) ends generation and frees the engine for the next request."""

    def __init__(self, gen: Iterator[str], holder: dict):
        self._gen = gen
        self._holder = holder

    def __iter__(self) -> "Stream":
        return self

    def __next__(self) -> str:
        return next(self._gen)

    def close(self) -> None:
        self._gen.close()

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def result(self) -> GenerationResult | None:
        return self._holder.get("result")

    @property
    def prompt_tokens(self) -> int | None:
        """Known before the first delta (the request is validated and tokenized on creation)."""
        return self._holder.get("prompt_tokens")


class Engine:
    def __init__(self, bundle: Bundle, target: ModelRunner, draft: ModelRunner | None, tokenizer, *,
                 draft_mode: str = "auto", k: int | None = None, governor=None, memory_plan=None,
                 prefill_chunk: int = PREFILL_CHUNK):
        self.bundle = bundle
        self.target = target
        self.draft_runner = draft
        self.tokenizer = tokenizer
        self.max_len = target.max_len
        self.model_name = bundle.name
        self.draft_mode = draft_mode
        self.k = k
        self.governor = governor
        self.memory_plan = memory_plan
        self.prefill_chunk = prefill_chunk
        tf = bundle.manifest.tokenizer
        self.usable = min(tf.usable_vocab, target.vocab_size)
        self.eos_ids = frozenset(tf.eos_ids)
        self.costs = CostModel(target.times, draft.times if draft is not None else None)
        self._ngram = NgramDrafter(self.costs)
        self._model = ModelDrafter(draft, self.usable, self.costs) if draft is not None else None
        self._auto = AutoDrafter(self.costs, self._ngram, self._model)
        self._cached: list[int] = []  # tokens whose K/V the target cache holds (a prefix of this list)
        self._lock = threading.Lock()
        cfg = bundle.tokenizer_config()
        self._bos_text = _token_text(cfg.get("bos_token")) or self._id_text(tf.bos_id)
        self._eos_text = _token_text(cfg.get("eos_token")) or self._id_text(tf.eos_ids[0] if tf.eos_ids else None)

    # -- opening --------------------------------------------------------------------------------
    @classmethod
    def open(cls, bundle: str | os.PathLike | Bundle, *, draft: str = "auto", k: int | None = None,
             max_len: int | None = None, providers=None, draft_providers=None, threads: int | None = None,
             device=None, memory_budget=None, power_budget=None, max_temp=None, verify: bool = True,
             warmup: bool = True) -> "Engine":
        """Verifies the bundle (sha256 unless verify=False), plans memory, loads the models.

        draft: the default drafting mode of requests ("auto" | "model" | "ngram" | "none"). With
        "ngram" or "none" the draft model is not loaded at all (less memory, faster start).
        warmup: time the step sizes adaptive drafting chooses between once at open (about 1 s on
        a 2-core CPU), so the first request neither pays one-off allocations nor guesses costs.
        device: None (no board defaults), "auto" (this board, detected) or a profile name: its
        provider orders, threads, default memory budget and max_len fill what is left unset
        (docs/edge.md, "What --device sets"); explicit options always win."""
        _check_draft_mode(draft)
        _check_k(k)
        # every edge option is checked before the bundle is read: a typo costs no model load
        edge = _edge_options(device, providers, draft_providers, threads, memory_budget, power_budget, max_temp)
        providers, draft_providers, threads = edge["providers"], edge["draft_providers"], edge["threads"]
        b = bundle if isinstance(bundle, Bundle) else Bundle.open(bundle, verify=verify)
        if draft == "model" and b.draft is None:
            raise DraftUnavailable(f"bundle {b.name} has no draft model: use draft='ngram' or 'auto'", param="draft")
        want_draft = draft in ("auto", "model") and b.draft is not None
        plan = _memory_plan(b, max_len=max_len, want_draft=want_draft, profile=edge["profile"],
                            budget=edge["memory_budget"])
        if plan is not None:
            max_len, load_draft, chunk = plan.max_len, plan.load_draft, getattr(plan, "prefill_chunk", PREFILL_CHUNK)
            for note in plan.notes:  # what a budget changed matters; the rest is detail
                log.log(logging.INFO if plan.budget_bytes is not None else logging.DEBUG, "memory plan: %s", note)
        else:
            load_draft, chunk = want_draft, PREFILL_CHUNK
            if max_len is None:
                max_len = min(b.target.max_context, DEFAULT_MAX_LEN)
            if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 2:
                raise InvalidRequest(f"max_len must be an integer >= 2, got {max_len!r}", param="max_len")
            max_len = min(max_len, b.target.max_context)
        if draft == "model" and not load_draft:
            raise DraftUnavailable("the memory budget leaves no room for the draft model: use draft='ngram' "
                                   "or 'auto', or raise the budget", param="draft")
        # both models on one shared thread pool: they take turns, and must not fight over cores
        target = load_runner(b.model_path("target"), b.target, max_len, providers=providers, threads=threads,
                             shared_threads=load_draft, profile=edge["profile"])
        draft_runner = None
        if load_draft:
            draft_runner = load_runner(b.model_path("draft"), b.draft, max_len,
                                       providers=draft_providers if draft_providers is not None else providers,
                                       threads=threads, shared_threads=True, profile=edge["profile"])
        governor = _governor(edge, spinning=_sessions_spin(load_draft))
        eng = cls(b, target, draft_runner, b.load_tokenizer(), draft_mode=draft, k=k, governor=governor,
                  memory_plan=plan, prefill_chunk=chunk)
        if warmup and draft != "none":
            eng.warmup()
        return eng

    def close(self) -> None:
        with self._lock:
            if self.governor is not None and hasattr(self.governor, "close"):
                self.governor.close()
            self.target = None  # type: ignore[assignment]
            self.draft_runner = None
            self._model = None
            self._auto.model = None

    @property
    def has_draft(self) -> bool:
        return self.draft_runner is not None

    # -- the public calls -------------------------------------------------------------------------
    def generate(self, prompt: str | None = None, *, messages=None, max_new_tokens: int = 256,
                 temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, seed: int | None = None,
                 stop=None, draft: str | None = None, k: int | None = None, cancel=None) -> GenerationResult:
        s = self.stream(prompt, messages=messages, max_new_tokens=max_new_tokens, temperature=temperature,
                        top_p=top_p, top_k=top_k, seed=seed, stop=stop, draft=draft, k=k, cancel=cancel)
        for _ in s:
            pass
        assert s.result is not None
        return s.result

    def stream(self, prompt: str | None = None, *, messages=None, max_new_tokens: int = 256,
               temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, seed: int | None = None,
               stop=None, draft: str | None = None, k: int | None = None, cancel=None) -> Stream:
        """Validates and tokenizes now (bad input raises here, before anything runs); generation
        runs as the stream is iterated."""
        req = self._request(prompt, messages, max_new_tokens, temperature, top_p, top_k, seed, stop, draft, k, cancel)
        holder: dict = {"prompt_tokens": len(req.ids)}
        return Stream(self._run(req, holder), holder)

    def count_tokens(self, prompt: str | None = None, *, messages=None) -> int:
        return len(self._encode(prompt, messages))

    def encode(self, prompt: str | None = None, *, messages=None) -> list[int]:
        """The token ids a request with this prompt or these messages starts from."""
        return self._encode(prompt, messages)

    def warmup(self, k_max: int = 4) -> None:
        """Runs each step size up to k_max + 1 tokens twice (the first run of a shape pays one-off
        allocations, the second is what the cost model keeps), so the first request is not slowed
        by them and adaptive drafting starts from this device's real costs."""
        with self._lock:
            self._invalidate()
            for s in range(1, min(k_max + 1, self.max_len - 1) + 1):
                for _ in range(2):
                    self.target.rewind(0)
                    self.target.step([0] * s, s)  # as a verify: every row scored
            if self.draft_runner is not None:
                for s in (1, 2):
                    for _ in range(2):
                        self.draft_runner.rewind(0)
                        self.draft_runner.step([0] * s, 1)
            self._invalidate()

    # -- requests ---------------------------------------------------------------------------------
    def _encode(self, prompt, messages) -> list[int]:
        if prompt is not None and messages is not None:
            raise InvalidRequest("pass either a prompt or messages, not both", param="prompt")
        if messages is not None:
            from .chat import render

            text = render(self.bundle.manifest.tokenizer.chat_template, messages,
                          bos_token=self._bos_text, eos_token=self._eos_text)
        elif prompt is None:
            raise InvalidRequest("a prompt or messages are required", param="prompt")
        elif not isinstance(prompt, str):
            raise InvalidRequest(f"prompt must be a string, got {type(prompt).__name__}", param="prompt")
        elif not prompt:
            raise InvalidRequest("prompt is empty", param="prompt")
        else:
            text = prompt
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        tf = self.bundle.manifest.tokenizer
        if tf.add_bos and tf.bos_id is not None and (not ids or ids[0] != tf.bos_id):
            ids = [tf.bos_id, *ids]
        if not ids:
            raise InvalidRequest("prompt is empty after tokenization", param="prompt")
        return ids

    def _request(self, prompt, messages, max_new_tokens, temperature, top_p, top_k, seed, stop, draft, k,
                 cancel) -> _Request:
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens <= 0:
            raise InvalidRequest(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}",
                                 param="max_new_tokens")
        params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
        mode = self.draft_mode if draft is None else draft
        _check_draft_mode(mode)
        if mode == "model" and self._model is None:
            why = ("the bundle has no draft model" if self.bundle.draft is None else
                   "the draft model was not loaded (engine opened with draft="
                   f"{self.draft_mode!r}, or the memory plan left it out)")
            raise DraftUnavailable(f"draft='model' is not possible: {why}", param="draft")
        _check_k(k)
        stops = _check_stop(stop)
        ids = self._encode(prompt, messages)
        if len(ids) >= self.max_len:
            raise PromptTooLong(len(ids), max_new_tokens, self.max_len)
        return _Request(ids, max_new_tokens, params, stops, mode, self.k if k is None else k, _cancel_fn(cancel))

    def _drafter(self, mode: str, k: int | None) -> tuple[Drafter, int]:
        """The drafter and per-round proposal cap for a mode. k=None lets the drafter choose each
        round from measured costs (up to DEFAULT_K_CAP); a given k is used as is."""
        if mode == "none":
            return NoDrafter(), 0
        adaptive = k is None
        cap = DEFAULT_K_CAP if k is None else k
        if mode == "ngram":
            self._ngram.adaptive = adaptive
            return self._ngram, cap
        if mode == "model":
            self._model.adaptive = adaptive
            return self._model, cap
        self._ngram.adaptive = True
        if self._model is not None:
            self._model.adaptive = True
        return self._auto, cap

    def reset_cache(self) -> None:
        """Forgets what the caches hold, so the next request prefills its whole prompt (benchmarks
        use this to time every mode from the same start). Waits for a running request."""
        with self._lock:
            self._invalidate()

    def _invalidate(self) -> None:
        """Forget what the caches hold (after an error mid-step, or a warm-up)."""
        self._cached = []
        if self.target is not None:
            self.target.reset()
        if self._model is not None:
            self._model.runner.reset()
            self._model.tokens.clear()

    # -- the loop ---------------------------------------------------------------------------------
    def _run(self, req: _Request, holder: dict) -> Iterator[str]:
        with self._lock:
            if self.target is None:
                raise InvalidRequest("this engine is closed", param=None)
            try:
                yield from self._generate(req, holder)
            except BaseException:
                self._invalidate()
                raise

    def _generate(self, req: _Request, holder: dict) -> Iterator[str]:
        t0 = time.perf_counter()
        target, usable, params = self.target, self.usable, req.params
        rng = make_rng(params.seed)
        stats = GenerationStats(prompt_tokens=len(req.ids), drafter=req.draft)
        gov = self.governor
        mark = gov.mark() if gov is not None and hasattr(gov, "mark") else None
        drafter, k_cap = self._drafter(req.draft, req.k)

        # prefill only what the cache does not already hold (at least the last prompt token)
        reuse = min(common_prefix(self._cached, req.ids), len(req.ids) - 1, target.length)
        stats.cached_tokens = reuse
        target.rewind(reuse)
        ctx = list(req.ids)
        self._cached = ctx  # the target cache holds ctx[:target.length] from here on
        if req.cancel():
            return self._finish(holder, "", [], "cancelled", stats, t0, t0, mark)
        row = None
        for i in range(reuse, len(ctx), self.prefill_chunk):
            row = target.step(ctx[i : i + self.prefill_chunk], 1)[0]
        stats.target_passes = 1
        drafter.begin(ctx)
        if self._model is not None and drafter in (self._model, self._auto) and k_cap > 0:
            self._model.prefill(ctx)  # prompt processing for the draft too: part of the TTFT
        first = choose(row, params, usable, rng)
        ctx.append(first)
        t_first = time.perf_counter()
        stats.ttft_s = t_first - t0

        text = TextStream(self.tokenizer, req.ids, req.stop)
        out: list[int] = []
        finish = None
        pending = [first]
        while True:
            for t in pending:  # emit this round's tokens until a stop condition hits
                if t in self.eos_ids:
                    finish = "stop"
                    break
                out.append(t)
                delta = text.push(t)
                if delta:
                    yield delta
                if text.stopped:
                    finish = "stop"
                    break
                if len(out) >= req.max_new_tokens:
                    finish = "length"
                    break
            if finish:
                break
            if req.cancel():
                finish = "cancelled"
                break
            free = target.max_len - target.length  # the newest token needs a slot, proposals one each
            if free < 1:
                finish = "cache_full"
                break
            k = min(k_cap, free - 1, req.max_new_tokens - len(out) - 1)
            round_drafter = drafter
            pace = 0.0
            if gov is not None:
                lim = gov.limits()
                if lim.max_k is not None:
                    k = min(k, lim.max_k)
                if lim.drafting == "none":
                    k = 0
                elif lim.drafting == "ngram" and drafter is not self._ngram and not isinstance(drafter, NoDrafter):
                    round_drafter = self._ngram
                pace = lim.pace_s
            r = speculative_round(target, round_drafter, ctx, max(0, k), params, rng, usable)
            ctx.extend(r.tokens)
            stats.target_passes += 1
            stats.rounds += 1
            stats.drafted += r.drafted
            stats.accepted += r.accepted
            stats.rounds_by_source[r.source] = stats.rounds_by_source.get(r.source, 0) + 1
            if gov is not None:
                gov.on_tokens(len(r.tokens))
                if pace > 0:
                    time.sleep(pace)
            pending = r.tokens
        tail = text.finish()
        if tail:
            yield tail
        return self._finish(holder, text.text, out, finish, stats, t0, t_first, mark)

    def _finish(self, holder, text, out, finish, stats, t0, t_first, mark):
        now = time.perf_counter()
        stats.new_tokens = len(out)
        stats.total_s = now - t0
        if stats.drafted:
            stats.acceptance_rate = stats.accepted / stats.drafted
        if stats.target_passes:
            stats.tokens_per_pass = len(out) / stats.target_passes
        if stats.rounds:
            stats.k_mean = stats.drafted / stats.rounds
        if len(out) > 1 and now > t_first:
            stats.decode_tokens_per_second = (len(out) - 1) / (now - t_first)
        if mark is not None:
            try:
                stats.energy_j_per_token = self.governor.j_per_token_since(mark)
            except Exception:  # a sensor read failing must not fail the request
                stats.energy_j_per_token = None
        holder["result"] = GenerationResult(text, out, finish, stats)
        return None

    def _id_text(self, token_id: int | None) -> str:
        if token_id is None:
            return ""
        return self.tokenizer.id_to_token(token_id) or ""


# --- helpers -------------------------------------------------------------------------------------
def _token_text(v) -> str:
    if isinstance(v, dict):
        v = v.get("content")
    return v if isinstance(v, str) else ""


def _check_draft_mode(mode) -> None:
    if mode not in DRAFT_MODES:
        raise InvalidRequest(f"unknown drafter {mode!r}: choose one of {', '.join(DRAFT_MODES)}", param="draft")


def _check_k(k) -> None:
    if k is None:
        return
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= K_LIMIT:
        raise InvalidRequest(f"k must be an integer from 1 to {K_LIMIT} (or None: chosen each round), got {k!r}",
                             param="k")


def _check_stop(stop) -> list[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
        raise InvalidRequest("stop must be a string or a list of strings", param="stop")
    if len(stop) > 16:
        raise InvalidRequest(f"at most 16 stop strings, got {len(stop)}", param="stop")
    if any(s == "" for s in stop):
        raise InvalidRequest("stop strings must not be empty", param="stop")
    return list(stop)


def _cancel_fn(cancel) -> Callable[[], bool]:
    if cancel is None:
        return lambda: False
    if hasattr(cancel, "is_set"):
        return cancel.is_set
    if callable(cancel):
        return lambda: bool(cancel())
    raise InvalidRequest("cancel must be a threading.Event or a callable returning bool", param="cancel")


def _edge_options(device, providers, draft_providers, threads, memory_budget, power_budget, max_temp) -> dict:
    """Checks the device and edge options (each bad value is an InvalidRequest naming its option)
    and fills what the caller left unset from the device profile (devices.engine_defaults).

    device: None -> no profile (onnxruntime's defaults, no default memory budget); "auto" -> the
    board this runs on, detected; a name or alias -> that profile; a DeviceProfile -> itself. A
    profile's memory is what this machine's kernel reports when the profile has none (a Pi 4) or
    when it is the board itself. Explicit options always win over the profile."""
    from . import devices, providers as prov

    profile = None
    if device is not None:
        profile = devices.with_measured_memory(devices.resolve(device))
    if providers is not None:
        prov.normalize(providers)
    if draft_providers is not None:
        try:
            prov.normalize(draft_providers)
        except InvalidRequest as e:
            raise InvalidRequest(f"draft providers: {e}", param="draft_providers") from None
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= 1024):
        raise InvalidRequest(f"threads must be an integer from 1 to 1024 (or None: onnxruntime's default), "
                             f"got {threads!r}", param="threads")
    out = devices.engine_defaults(profile, providers=providers, draft_providers=draft_providers, threads=threads)
    out["profile"] = profile
    out["memory_budget"] = None
    if memory_budget is not None:
        from .memory import parse_size

        out["memory_budget"] = parse_size(memory_budget)
    out["power_budget_w"] = out["max_temp_c"] = None
    if power_budget is not None or max_temp is not None:
        from .governor import parse_celsius, parse_watts

        out["power_budget_w"] = parse_watts(power_budget) if power_budget is not None else None
        out["max_temp_c"] = parse_celsius(max_temp) if max_temp is not None else None
    return out


def _memory_plan(b: Bundle, *, max_len, want_draft: bool, profile, budget: int | None):
    """The memory module's plan: `budget` (bytes) or else the profile's default budget decides the
    cache length and whether the draft is loaded; with neither, nothing is shrunk."""
    from . import memory

    return memory.plan(b, max_len=max_len, want_draft=want_draft, budget_bytes=budget, profile=profile)


def _sessions_spin(load_draft: bool) -> bool:
    """Whether the sessions just created busy-wait between ops (what the governor's fewer-cores rung
    depends on). The shared pool (providers.use_shared_thread_pool) always spins: the Python API of
    onnxruntime cannot turn spinning off for its global pool (docs/edge.md, "Spinning"); without the
    shared pool, two models fall back to per-session pools without spinning (runner.load_runner),
    and a model alone gets a per-session pool with onnxruntime's default, spinning."""
    from .providers import shared_pool_active

    if shared_pool_active():
        return True
    return not load_draft


def _governor(edge: dict, *, spinning: bool):
    """A governor when a power or temperature limit is asked for or a device is named (then it
    measures energy and applies the profile's temperature limit); None otherwise."""
    if edge["power_budget_w"] is None and edge["max_temp_c"] is None and edge["profile"] is None:
        return None
    from . import governor

    return governor.from_options(device=edge["profile"], power_budget=edge["power_budget_w"],
                                 max_temp=edge["max_temp_c"], spinning=spinning)
